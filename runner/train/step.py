"""One optimizer step, behind one interface: pp = 1 and pp > 1 are its two implementations.

:class:`MicroBatchSteps` (runner/train/micro_steps.py) runs the batch contract's
micro-batches itself; :class:`PipelineSteps` (runner/train/pipeline_steps.py) hands them to
DeepSpeed's PipelineEngine, which schedules them 1F1B. The loop (runner/train/loop.py) sees
only :class:`Steps`, chosen once by :func:`runner.train.setup.build_steps`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from runner.data.batches import BatchSource
from runner.metrics.ledger import Ledger
from runner.metrics.phase_clock import PhaseClock
from runner.metrics.step_probes import StepProbes
from runner.train.nonfinite import NonFiniteGuard


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step leaves: its loss (the mean over the global batch, the same on
    every rank), whether its update was skipped for a non-finite loss, its gradient norm, and
    the measured ledger when the step measured it."""

    loss: float
    skipped: bool
    grad_norm: float | None
    ledger: Ledger | None = None
    step_s: float = float("nan")  # the step's wall seconds, timed by the loop


@dataclass(frozen=True)
class StepParts:
    """What either implementation steps with, built once by runner/train/setup.py."""

    engine: Any  # DeepSpeed's engine (a PipelineEngine when pp > 1)
    batches: BatchSource  # the training batches, the same sequences on every layout
    nonfinite: NonFiniteGuard  # train.on_nonfinite: stop, or skip the update
    clock: PhaseClock  # where each step's time goes
    probes: StepProbes  # the noise scale and exposed communication
    nan_steps: frozenset[int] = frozenset()  # LADDER_INJECT_NAN (tests of train.on_nonfinite)


class Steps(Protocol):
    """Runs optimizer steps of one layout and measures what the loop cannot see."""

    def run(self, step: int, *, measure_states: bool, measure_activations: bool) -> StepOutcome:
        """Forward, backward and the optimizer step over every micro-batch of ``step``.

        ``measure_states``: measure the model states at the accumulation boundary;
        ``measure_activations``: count what the first micro-batch saves for backward.
        """
        ...

    def eval_loss(self, held_out: BatchSource, *, batches: int) -> float:
        """The mean held-out loss over ``batches`` global batches, the same on every rank."""
        ...

    def summary(self, *, step_s: float | None, p2p_s: float | None) -> dict[str, Any] | None:
        """What summary.json keeps about how the steps ran (the pipeline's split), or None."""
        ...
