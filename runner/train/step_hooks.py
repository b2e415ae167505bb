"""The seams of one optimizer step, where the step calls its hooks, whichever function runs it.

Without a pipeline the trainer runs the step itself (runner/train/trainer.py
``Trainer.micro_batch_step``) and calls each hook in its loop; under a pipeline DeepSpeed's
``PipelineEngine.train_batch`` runs it, and runner/train/pipeline_hooks.py has the engine call the
same hooks from inside its schedule. What a step does at a seam is written once, as a hook:
the non-finite check before the update (runner/train/nonfinite.py), the first micro-batch's
saved tensors, the noise scale's probe and the model states at the boundary
(runner/train/step_measurements.py), and whatever a run adds (runner/train/setup.py
``extra_step_hooks``: a test's faults).

Per step a rank calls, in this order:

- :meth:`~StepHooks.before_step` once;
- per micro-batch: :meth:`~StepHooks.forward` around its forward, then :meth:`~StepHooks.loss`
  on the loss it formed, then :meth:`~StepHooks.after_backward` once its backward has run;
- :meth:`~StepHooks.before_update` at the accumulation boundary, before the optimizer step;
- :meth:`~StepHooks.after_step` once the step's metrics went to the sinks.

A pipeline stage runs only its part of each micro-batch: its forward and backward, and the
loss only on a last stage, where it is formed; every rank reaches the boundary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch


class StepHooks(Protocol):
    """What a step calls at its seams; a hook class subclasses this and overrides the seams it
    needs (each default does nothing)."""

    def before_step(self, step: int) -> None:
        """Before ``step`` starts, outside its time."""
        return None

    def forward(self, step: int, micro: int) -> contextlib.AbstractContextManager[None]:
        """Entered around micro-batch ``micro``'s forward. A pipeline's last stage computes its
        loss apart from its forward and enters it around each."""
        return contextlib.nullcontext()

    def loss(self, step: int, micro: int, loss: torch.Tensor) -> torch.Tensor:
        """The loss micro-batch ``micro``'s forward formed; the one returned is the one its
        backward and the step's loss take."""
        return loss

    def after_backward(self, step: int, micro: int) -> None:
        """Once micro-batch ``micro``'s backward has run on this rank."""
        return None

    def before_update(self, step: int, loss: float) -> bool:
        """At the accumulation boundary, before the optimizer step: ``loss`` is the step's loss,
        the mean over the global batch, the same on every rank. True: skip this step's update."""
        return False

    def after_step(self, step: int) -> None:
        """Once ``step``'s metrics went to the sinks, before a checkpoint or a stop."""
        return None


class StepHookChain(StepHooks):
    """Several hooks called as one, in the order given: at each seam every hook is called; the
    loss passes through each in turn, and the update is skipped if any hook says so."""

    def __init__(self, hooks: Sequence[StepHooks]) -> None:
        self.hooks = tuple(hooks)

    def before_step(self, step: int) -> None:
        """Each hook's ``before_step``."""
        for hook in self.hooks:
            hook.before_step(step)

    @contextlib.contextmanager
    def forward(self, step: int, micro: int) -> Iterator[None]:
        """Each hook's ``forward``, the first entered outermost."""
        with contextlib.ExitStack() as entered:
            for hook in self.hooks:
                entered.enter_context(hook.forward(step, micro))
            yield

    def loss(self, step: int, micro: int, loss: torch.Tensor) -> torch.Tensor:
        """The loss after each hook's ``loss`` in turn."""
        for hook in self.hooks:
            loss = hook.loss(step, micro, loss)
        return loss

    def after_backward(self, step: int, micro: int) -> None:
        """Each hook's ``after_backward``."""
        for hook in self.hooks:
            hook.after_backward(step, micro)

    def before_update(self, step: int, loss: float) -> bool:
        """Each hook's ``before_update``; whether any of them skips the update."""
        skip = False
        for hook in self.hooks:
            skip = hook.before_update(step, loss) or skip
        return skip

    def after_step(self, step: int) -> None:
        """Each hook's ``after_step``."""
        for hook in self.hooks:
            hook.after_step(step)
