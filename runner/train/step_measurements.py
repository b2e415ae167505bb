"""What a step measures from inside, as step hooks (runner/train/step_hooks.py), for both step functions.

- The bytes the first micro-batch of the attempt saves for backward (the ledger's
  ``activations``), counted around its forward (runner/metrics/ledger.py ``saved_activations``);
- each micro-batch's gradient, read by the noise scale's probe once its backward has run
  (runner/metrics/step_probes.py);
- the model states at one step's accumulation boundary, before the optimizer step (the ledger's
  other terms: runner/metrics/ledger.py ``measure_model_states``).

The trainer says before each step what it measures (:meth:`StepMeasurements.expect`) and reads
the ledger after it (:meth:`StepMeasurements.ledger`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from runner.config import Precision
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.metrics.ledger import Ledger, fullest_device, measure_model_states, saved_activations
from runner.metrics.step_probes import StepProbes
from runner.train.step_hooks import StepHooks


class StepMeasurements(StepHooks):
    """The step's saved tensors, gradients and model states, measured at its seams."""

    def __init__(self, engine: DeepSpeedEngine, *, probes: StepProbes, precision: Precision) -> None:
        self.engine = engine
        self.probes = probes
        self.precision = precision
        self.saved_bytes = 0  # what the first micro-batch of the attempt saved for backward
        self._activations = False  # the coming step counts its first micro-batch's saved tensors
        self._states = False  # the coming step measures the model states at its boundary
        self._measured: Ledger | None = None  # this rank's model states, measured at the boundary

    def expect(self, *, states: bool, activations: bool) -> None:
        """What the coming step measures: the model states at its boundary, and what its first
        micro-batch saves for backward."""
        self._states, self._activations = states, activations
        self._measured = None
        if activations:
            self.saved_bytes = 0

    @contextlib.contextmanager
    def forward(self, step: int, micro: int) -> Iterator[None]:
        """Count what the first micro-batch's forward saves for backward, when the step counts it;
        a pipeline's last stage adds its loss's."""
        if not (self._activations and micro == 0):
            yield
            return
        with saved_activations(self.engine.module) as saved:
            yield
        self.saved_bytes += saved["activations"]

    def after_backward(self, step: int, micro: int) -> None:
        """Close the micro-batch's gradient for the noise scale."""
        self.probes.micro_batch_done(self.engine)

    def before_update(self, step: int, loss: float) -> bool:
        """Measure this rank's model states at the boundary, when the step measures them."""
        if self._states:
            self._measured = measure_model_states(self.engine, precision=self.precision)
        return False

    def ledger(self) -> Ledger | None:
        """The ledger this step measured, each term at its most over ranks (None: none measured).
        Every rank calls it after the step: the most over ranks is a collective."""
        if self._measured is None:
            return None
        self._measured.terms["activations"] = self.saved_bytes
        return fullest_device(self._measured)
