"""Faults the tests inject into a run's steps, as one step hook (runner/train/step_hooks.py).

Nothing in ladder injects a fault: a test installs this hook in a run's ranks through
``LADDER_STEP_HOOKS=<this file>:hooks`` (runner/train/setup.py ``extra_step_hooks``), which
:func:`train_helpers.injecting` sets beside the faults asked. Each fault is an environment
variable the ranks inherit:

- ``LADDER_INJECT_NAN=<rank>:<step>[,<step>...]``: that rank's loss is NaN at those steps (tests
  of train.on_nonfinite). Under a pipeline only a last stage forms the loss: the rank named is one.
- ``LADDER_INJECT_FAULT=<rank>:<step>``: that rank raises as the step starts (tests of a rank's
  failure).
- ``LADDER_INJECT_STEP_S=<seconds>``: every rank sleeps so long after each step, outside the
  step's time (tests of a time limit that lands mid-run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import torch

from runner.train.step_hooks import StepHooks


def rank_steps(spec: str, rank: int) -> frozenset[int]:
    """The steps ``<rank>:<step>[,<step>...]`` names for ``rank``: none for another rank or no spec."""
    if ":" not in spec:
        return frozenset()
    named, steps = spec.split(":", 1)
    return frozenset(int(s) for s in steps.split(",")) if int(named) == rank else frozenset()


class StepFaults(StepHooks):
    """The faults ``LADDER_INJECT_*`` asks of this rank's steps."""

    def __init__(self, rank: int, environ: Mapping[str, str]) -> None:
        self.rank = rank
        self.nan_steps = rank_steps(environ.get("LADDER_INJECT_NAN", ""), rank)
        self.fault_steps = rank_steps(environ.get("LADDER_INJECT_FAULT", ""), rank)
        self.sleep_s = float(environ.get("LADDER_INJECT_STEP_S") or 0)

    def before_step(self, step: int) -> None:
        """LADDER_INJECT_FAULT: raise as the step starts."""
        if step in self.fault_steps:
            raise RuntimeError(f"fault injected by LADDER_INJECT_FAULT on rank {self.rank} at step {step}")

    def loss(self, step: int, micro: int, loss: torch.Tensor) -> torch.Tensor:
        """LADDER_INJECT_NAN: every micro-batch's loss NaN at the steps named."""
        return loss * float("nan") if step in self.nan_steps else loss

    def after_step(self, step: int) -> None:
        """LADDER_INJECT_STEP_S: sleep after the step."""
        time.sleep(self.sleep_s)


def hooks(*, rank: int) -> StepFaults:
    """What ``LADDER_STEP_HOOKS=<this file>:hooks`` installs in rank ``rank``: the faults its
    environment asks."""
    return StepFaults(rank, os.environ)
