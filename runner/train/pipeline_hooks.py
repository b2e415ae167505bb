"""Inside a pipeline's step: what DeepSpeed's PipelineEngine does out of the trainer's sight.

``PipelineEngine.train_batch`` runs forward, backward and the optimizer step of all the batch
contract's micro-batches, 1F1B (runner/parallel/pipeline.py has the schedule and its sources).
What the trainer sees directly without a pipeline is reached through the engine's hooks here:
the step's phases (its instruction map), each micro-batch's backward (for the noise scale),
the loss before the update (for train.on_nonfinite) and the model states at the accumulation
boundary. The trainer (runner/train/trainer.py ``Trainer.pipeline_step``) calls
``train_batch`` itself; :class:`PipelineHooks` only watches.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

from runner.config import Precision
from runner.engine.deepspeed_engine import PipelineEngine, pipeline_stages
from runner.layout import Layout
from runner.metrics.ledger import Ledger, fullest_device, measure_model_states, saved_activations
from runner.metrics.phase_clock import PhaseClock
from runner.metrics.step_probes import StepProbes
from runner.parallel.pipeline_split import stage_blocks
from runner.train.nonfinite import NonFiniteGuard, skipping

# DeepSpeed's pipeline instructions (deepspeed/runtime/pipe/schedule.py) by the step phase
# their time counts in (runner/metrics/phase_clock.py). The data-parallel and tied-weight gradient
# reductions count in backward, as ZeRO's reductions do without a pipeline.
_INSTRUCTION_PHASES = {
    "LoadMicroBatch": "data",
    "ForwardPass": "forward",
    "BackwardPass": "backward",
    "ReduceGrads": "backward",
    "ReduceTiedGrads": "backward",
    "OptimizerStep": "optimizer",
    "SendActivation": "p2p",
    "RecvActivation": "p2p",
    "SendGrad": "p2p",
    "RecvGrad": "p2p",
}


class PipelineHooks:
    """Hooks in a PipelineEngine: the step's phases, the loss checked before the update, the
    model states at the boundary and the first micro-batch's activations."""

    def __init__(
        self,
        engine: PipelineEngine,
        *,
        layout: Layout,
        precision: Precision,
        nonfinite: NonFiniteGuard,
        clock: PhaseClock,
        probes: StepProbes,
        nan_steps: frozenset[int],
    ) -> None:
        self.engine = engine
        self.layout = layout
        self.precision = precision
        self.nonfinite = nonfinite
        self.step = 0  # the step train_batch is running
        self.skipped = False  # this step's update was skipped (train.on_nonfinite=skip)
        self._measure_states = False
        self._states: Ledger | None = None
        self._saved_bytes = 0
        if nan_steps and engine.is_last_stage():
            self._inject_nan(engine, nan_steps)
        self._check_before_update(engine)
        self._time_phases(engine, clock)
        self._after_each_backward(engine, lambda: probes.micro_batch_done(engine))

    def step_started(self, step: int, *, measure_states: bool, measure_activations: bool) -> None:
        """Before ``train_batch``: which step runs, and what it measures."""
        self.step = step
        self.skipped = False
        self._measure_states = measure_states
        if measure_activations:
            self._measure_first_micro_batch(self.engine)

    def step_done(self) -> None:
        """After ``train_batch``, however it ended: the next step measures only if asked."""
        self._measure_states = False

    def _check_before_update(self, engine: PipelineEngine) -> None:
        """The optimizer step runs inside train_batch: wrap it so that the model states are
        measured and the loss checked just before it, at the accumulation boundary, as the
        trainer does without a pipeline."""
        take_model_step = engine._take_model_step

        def at_boundary(*args: Any, **kwargs: Any) -> Any:
            if self._measure_states:
                self._states = measure_model_states(engine, precision=self.precision)
            # Decided before the update, the same on every rank (runner/train/nonfinite.py): a
            # non-finite loss stops the run here or skips this step's update.
            self.skipped = self.nonfinite.should_skip(self._mean_loss(engine), step=self.step)
            if not self.skipped:
                return take_model_step(*args, **kwargs)
            with skipping(engine):
                return take_model_step(*args, **kwargs)

        engine._take_model_step = at_boundary

    def _mean_loss(self, engine: PipelineEngine) -> float:
        """The step's loss, averaged over its micro-batches and the pipelines, on every rank.

        Only a last stage has it (DeepSpeed's ``total_loss``, summed over the micro-batches)
        before the step: one all-reduce over all ranks sums the last stages' losses and counts
        them.
        """
        local = torch.zeros(2, dtype=torch.float64, device=engine.device)
        if engine.is_last_stage():
            assert engine.total_loss is not None  # a last stage has summed its micro-batches' losses
            local[0] = engine.total_loss.detach().double() / self.layout.accum_steps
            local[1] = 1.0
        torch.distributed.all_reduce(local)
        return float(local[0] / local[1])

    def _inject_nan(self, engine: PipelineEngine, steps: frozenset[int]) -> None:
        """LADDER_INJECT_NAN on a last stage: its loss is NaN at ``steps`` (tests of train.on_nonfinite)."""
        module = pipeline_stages(engine)
        loss_fn = module.loss_fn
        assert loss_fn is not None  # runner/parallel/pipeline.py gives the pipeline its loss

        def loss_at_step(*args: Any) -> Any:
            loss = loss_fn(*args)
            return loss * float("nan") if self.step in steps else loss

        module.loss_fn = loss_at_step

    @staticmethod
    def _time_phases(engine: PipelineEngine, clock: PhaseClock) -> None:
        """Mark ``clock`` around each instruction the engine runs, under the instruction's phase.

        ``PipelineEngine._exec_schedule`` looks every instruction up in ``self._INSTRUCTION_MAP``
        (DeepSpeed 0.19.8); an instance attribute of the same name takes the class's place.
        """

        def timed(run: Callable[..., Any], phase: str) -> Callable[..., Any]:
            def run_timed(engine: PipelineEngine, **kwargs: Any) -> Any:
                clock.mark("other")  # the engine's own work since the last instruction
                result = run(engine, **kwargs)
                clock.mark(phase)
                return result

            return run_timed

        engine._INSTRUCTION_MAP = {
            kind: timed(run, _INSTRUCTION_PHASES.get(kind.__name__, "other"))
            for kind, run in type(engine)._INSTRUCTION_MAP.items()
        }

    @staticmethod
    def _after_each_backward(engine: PipelineEngine, callback: Callable[[], None]) -> None:
        """Call ``callback`` once each micro-batch's backward pass has run on this stage."""
        instructions = dict(getattr(engine, "_INSTRUCTION_MAP", type(engine)._INSTRUCTION_MAP))
        for kind, run in instructions.items():
            if kind.__name__ == "BackwardPass":

                def backward_then(
                    engine: PipelineEngine, _run: Callable[..., Any] = run, **kwargs: Any
                ) -> Any:
                    result = _run(engine, **kwargs)
                    callback()
                    return result

                instructions[kind] = backward_then
        engine._INSTRUCTION_MAP = instructions

    def _measure_first_micro_batch(self, engine: PipelineEngine) -> None:
        """Count the tensors this stage saves for backward over its first forward (and loss)."""
        module, stages = engine.module, pipeline_stages(engine)
        forward, loss_fn = module.forward, stages.loss_fn

        def measured(call: Callable[..., Any], restore: Callable[[], None]) -> Callable[..., Any]:
            def once(*args: Any) -> Any:
                restore()
                with saved_activations(module) as saved:
                    out = call(*args)
                self._saved_bytes += saved["activations"]
                return out

            return once

        def restore_forward() -> None:
            module.forward = forward

        def restore_loss() -> None:
            stages.loss_fn = loss_fn

        module.forward = measured(forward, restore_forward)
        if loss_fn is not None and engine.is_last_stage():
            stages.loss_fn = measured(loss_fn, restore_loss)

    def ledger(self) -> Ledger | None:
        """The measured ledger, each term at its most over ranks (every rank must call this)."""
        if self._states is None:
            return None
        self._states.terms["activations"] = self._saved_bytes
        return fullest_device(self._states)


def pipeline_summary(
    engine: PipelineEngine, layout: Layout, *, step_s: float | None, p2p_s: float | None
) -> dict[str, Any]:
    """What summary.json keeps about the pipeline: split, schedule, bubble predicted and measured.

    The bubble is (pp - 1) / accum of the ideal step (Narayanan et al. 2021, Sec. 2.2.1),
    so b / (1 + b) of the step as run. Measured: the share of the step rank 0 spent in
    stage-to-stage sends and receives (``time/p2p_s``), the wait for its neighbour stage
    plus the transfers themselves.
    """
    bubble = (layout.pp - 1) / layout.accum_steps
    timed = step_s is not None and math.isfinite(step_s) and step_s > 0
    p2p_share = p2p_s / step_s if timed and p2p_s is not None and step_s else None
    bounds = pipeline_stages(engine).parts
    return {
        "stages": layout.pp,
        "layers_per_stage": [int(b - a) for a, b in itertools.pairwise(bounds)],
        "blocks_per_stage": stage_blocks(int(bounds[-1]) - 3, layout.pp),
        "schedule": "1F1B (PipeDream-Flush, Narayanan et al. 2021), flushed every step",
        "micro_batches": layout.accum_steps,
        "bubble_fraction_predicted": bubble,
        "bubble_share_of_step_predicted": bubble / (1 + bubble),
        "p2p_share_of_step_measured": p2p_share,
        "measured_step_s": step_s if timed else None,
    }
