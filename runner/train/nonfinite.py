"""A non-finite loss: stop the run, or skip the step (no update) and go on (``train.on_nonfinite``).

The decision is taken at the accumulation boundary, before the optimizer step, from the loss
averaged over the ranks, so every rank takes the same one (under a pipeline, inside
DeepSpeed's schedule, from the last stages' losses: runner/parallel/pipeline.py). A skipped step:

- leaves the weights and the optimizer state (Adam's moments and step count) as they were:
  the basic optimizer's ``step`` is a no-op for that one call (:func:`skipping`), while the
  DeepSpeed wrapper around it (ZeRO 1/2/3, bf16) still runs its own bookkeeping and clears
  the accumulated and reduced gradients as after any step;
- moves the data position on: batches are a function of (seed, step) (runner/data/batches.py);
- advances the learning-rate schedule. The schedule is a function of the step index, like
  the data: the lr of step s does not depend on how many steps were skipped before it, and
  the cosine still ends at ``min_lr_ratio`` on the last step. (DeepSpeed's own fp16 overflow
  skip, ``DeepSpeedEngine._take_model_step``, and Megatron-LM's do not advance it; with
  NaN gradients DeepSpeed's ZeRO optimizers take that path here too, see :func:`skipping`.)

``train.max_skipped_steps`` bounds the skips of a run, so one that only produces NaNs still
stops with a clear error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runner.config import OnNonFinite
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.rundir.summary_records import SkippedStepsRecord
from runner.train.step_hooks import StepHooks


class NonFiniteGuard(StepHooks):
    """Decides, per step, whether a loss is fine, skipped or fatal; keeps the skipped steps. A step
    hook (runner/train/step_hooks.py): both step functions ask it at the boundary."""

    def __init__(self, policy: OnNonFinite, *, max_skipped: int, skipped: list[int] | None = None) -> None:
        self.policy = policy
        self.max_skipped = max_skipped
        self.skipped: list[int] = list(skipped or [])  # carried across a resume by the checkpoint

    def should_skip(self, loss: float, *, step: int) -> bool:
        """True: skip this step's update. Raises FloatingPointError when the run must stop."""
        if math.isfinite(loss):
            return False
        advice = "lower optimizer.lr, raise optimizer.warmup_steps, or use precision=fp32/bf16"
        if self.policy == OnNonFinite.stop:
            raise FloatingPointError(
                f"loss is {loss} at step {step}: training diverged; {advice}, "
                f"or set train.on_nonfinite=skip to skip such steps"
            )
        if len(self.skipped) >= self.max_skipped:
            raise FloatingPointError(
                f"loss is {loss} at step {step} after {len(self.skipped)} skipped steps "
                f"{self.skipped} (train.max_skipped_steps={self.max_skipped}): training diverged; "
                f"{advice}, or raise train.max_skipped_steps"
            )
        self.skipped.append(step)
        return True

    def before_update(self, step: int, loss: float) -> bool:
        """The step's hook at the boundary: :meth:`should_skip` on the step's loss."""
        return self.should_skip(loss, step=step)

    def summary(self) -> SkippedStepsRecord:
        """What summary.json keeps: the policy, how many steps were skipped and which."""
        return {"policy": self.policy.value, "count": len(self.skipped), "steps": list(self.skipped)}


def _no_step(*args: Any, **kwargs: Any) -> None:
    """The basic optimizer's step on a skipped step: nothing moves."""
    return None


@contextmanager
def skipping(engine: DeepSpeedEngine) -> Iterator[None]:
    """Run ``engine.step()`` at a boundary with no update; gradients are cleared as after a step.

    Why through ``engine.step()`` and not around it: the engine's step counts the
    micro-step and global step (its accumulation boundary is ``(micro_steps + 1) %
    accum == 0``) and the ZeRO wrappers release their reduced gradient partitions there
    (``DeepSpeedZeroOptimizer.step`` / ``DeepSpeedZeroOptimizer_Stage3.step``, DeepSpeed
    0.19.8). Only the innermost update is removed: ``engine.basic_optimizer.step`` (the
    torch optimizer itself at stage 0 in fp32; the one the wrapper steps on its fp32
    partitions otherwise). The wrapper then copies unchanged fp32 weights back to the
    16-bit ones, which leaves them as they were.
    """
    basic = engine.basic_optimizer
    # An instance attribute shadows the class's step for this call only.
    basic.step = _no_step  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        del basic.step
    # NaN/inf gradients make DeepSpeed's ZeRO and bf16 optimizers take their own overflow
    # path (no step, ``optimizer.overflow`` set), where the engine does not step the LR
    # schedule; it advances here, as on every other skipped step (module docstring).
    if getattr(engine.optimizer, "overflow", False) and engine.lr_scheduler is not None:
        engine.lr_scheduler.step()


def engine_step(engine: DeepSpeedEngine, *, skip: bool) -> None:
    """``engine.step()``; with ``skip`` (at an accumulation boundary) it applies no update."""
    if not skip:
        engine.step()
        return
    with skipping(engine):
        engine.step()
