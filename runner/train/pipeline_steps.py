"""An optimizer step through a pipeline: DeepSpeed's PipelineEngine runs the micro-batches 1F1B.

``PipelineEngine.train_batch`` runs forward, backward and the optimizer step of all the batch
contract's micro-batches (runner/parallel/pipeline.py has the schedule and its sources). What
the plain loop sees directly is reached through the engine's hooks here: the step's phases
(its instruction map), each micro-batch's backward (for the noise scale), the loss before the
update (for train.on_nonfinite) and the model states at the accumulation boundary.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from runner.data.batches import BatchSource, rank_slice
from runner.metrics.ledger import Ledger, fullest_device, measure_model_states, saved_activations
from runner.metrics.phase_clock import PhaseClock
from runner.parallel.pipeline_split import stage_blocks
from runner.train.context import RunContext
from runner.train.nonfinite import skipping
from runner.train.step import StepOutcome, StepParts

# DeepSpeed's pipeline instructions (deepspeed/runtime/pipe/schedule.py) by the step phase
# their time counts in (runner/metrics/phase_clock.py). The data-parallel and tied-weight gradient
# reductions count in backward, as ZeRO's reductions do in the plain loop.
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


class PipelineSteps:
    """Runs optimizer steps through DeepSpeed's PipelineEngine and measures what the loop cannot see."""

    def __init__(self, ctx: RunContext, parts: StepParts) -> None:
        engine = parts.engine
        self.engine = engine
        self.batches = parts.batches
        self.layout = ctx.layout
        self.precision = ctx.config.precision.name
        # The pipeline's data-parallel rank, from DeepSpeed's topology (pipe-major rank order).
        self.dp_rank = int(engine.grid.get_data_parallel_id())
        self.stage = int(engine.stage_id)
        self._boundary: Callable[[], None] | None = None
        self._states: Ledger | None = None
        self._saved_bytes = 0
        self._nonfinite = parts.nonfinite
        self._step = 0
        self._skip = False  # this step's update was skipped (train.on_nonfinite=skip)
        if parts.nan_steps and engine.is_last_stage():
            self._inject_nan(parts.nan_steps)
        # The optimizer step runs inside train_batch; model states are measured just before
        # it, at the accumulation boundary, as the plain loop does.
        take_model_step = engine._take_model_step

        def at_boundary(*args: Any, **kwargs: Any) -> Any:
            if self._boundary is not None:
                self._boundary()
            # Decided before the update, the same on every rank (runner/train/nonfinite.py): a
            # non-finite loss stops the run here or skips this step's update.
            self._skip = self._nonfinite.should_skip(self._mean_loss(), step=self._step)
            if not self._skip:
                return take_model_step(*args, **kwargs)
            with skipping(engine):
                return take_model_step(*args, **kwargs)

        engine._take_model_step = at_boundary
        self._time_phases(parts.clock)
        probes = parts.probes
        self._after_each_backward(lambda: probes.micro_batch_done(engine))

    def _mean_loss(self) -> float:
        """The step's loss, averaged over its micro-batches and the pipelines, on every rank.

        Only a last stage has it (DeepSpeed's ``total_loss``, summed over the micro-batches)
        before the step: one all-reduce over all ranks sums the last stages' losses and counts
        them.
        """
        engine = self.engine
        local = torch.zeros(2, dtype=torch.float64, device=engine.device)
        if engine.is_last_stage():
            local[0] = engine.total_loss.detach().double() / self.layout.accum_steps
            local[1] = 1.0
        torch.distributed.all_reduce(local)
        return float(local[0] / local[1])

    def _inject_nan(self, steps: frozenset[int]) -> None:
        """LADDER_INJECT_NAN on a last stage: its loss is NaN at ``steps`` (tests of train.on_nonfinite)."""
        module = self.engine.module
        loss_fn = module.loss_fn

        def loss_at_step(*args: Any) -> Any:
            loss = loss_fn(*args)
            return loss * float("nan") if self._step in steps else loss

        module.loss_fn = loss_at_step

    def _time_phases(self, clock: PhaseClock) -> None:
        """Mark ``clock`` around each instruction the engine runs, under the instruction's phase.

        ``PipelineEngine._exec_schedule`` looks every instruction up in ``self._INSTRUCTION_MAP``
        (DeepSpeed 0.19.8); an instance attribute of the same name takes the class's place.
        """

        def timed(run: Callable[..., Any], phase: str) -> Callable[..., Any]:
            def run_timed(engine: Any, **kwargs: Any) -> Any:
                clock.mark("other")  # the engine's own work since the last instruction
                result = run(engine, **kwargs)
                clock.mark(phase)
                return result

            return run_timed

        self.engine._INSTRUCTION_MAP = {
            kind: timed(run, _INSTRUCTION_PHASES.get(kind.__name__, "other"))
            for kind, run in type(self.engine)._INSTRUCTION_MAP.items()
        }

    def _after_each_backward(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once each micro-batch's backward pass has run on this stage."""
        instructions = dict(getattr(self.engine, "_INSTRUCTION_MAP", type(self.engine)._INSTRUCTION_MAP))
        for kind, run in instructions.items():
            if kind.__name__ == "BackwardPass":

                def backward_then(engine: Any, _run: Callable[..., Any] = run, **kwargs: Any) -> Any:
                    result = _run(engine, **kwargs)
                    callback()
                    return result

                instructions[kind] = backward_then
        self.engine._INSTRUCTION_MAP = instructions

    def _micro_batches(
        self, step: int, source: BatchSource | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This step's micro-batches of this pipeline's dp rank: the sequences every layout sees."""
        lay = self.layout
        source = self.batches if source is None else source
        for micro in range(lay.accum_steps):
            start = rank_slice(self.dp_rank, micro, lay.micro_size, lay.accum_steps)
            inputs, targets = source.micro_batch(step, start, lay.micro_size)
            yield inputs.to(self.engine.device), targets.to(self.engine.device)

    def eval_loss(self, held_out: BatchSource, *, batches: int) -> float:
        """The mean held-out loss over ``batches`` global batches (runner/train/evaluation.py), on every
        rank: DeepSpeed's ``eval_batch`` averages each over its micro-batches and the pipelines
        and broadcasts it from the last stage."""
        total = 0.0
        for batch in range(batches):
            total += float(self.engine.eval_batch(data_iter=self._micro_batches(batch, held_out)))
        return total / batches

    def _measure_first_micro_batch(self) -> None:
        """Count the tensors this stage saves for backward over its first forward (and loss)."""
        module = self.engine.module
        forward, loss_fn = module.forward, module.loss_fn

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
            module.loss_fn = loss_fn

        module.forward = measured(forward, restore_forward)
        if module.loss_fn is not None and self.engine.is_last_stage():
            module.loss_fn = measured(loss_fn, restore_loss)

    def run(self, step: int, *, measure_states: bool, measure_activations: bool) -> StepOutcome:
        """One optimizer step: the loss (the mean over the global batch, on every rank), whether
        its update was skipped for a non-finite loss, the gradient norm and, when asked, the
        measured ledger."""
        self._step = step
        self._skip = False
        if measure_activations:
            self._measure_first_micro_batch()
        if measure_states:

            def measure() -> None:
                self._states = measure_model_states(self.engine, precision=self.precision)

            self._boundary = measure
        try:
            loss = self.engine.train_batch(data_iter=self._micro_batches(step))
        finally:
            self._boundary = None
        # DeepSpeed averages the last stage's micro-batch losses over dp and broadcasts them.
        return StepOutcome(
            loss=float(loss),
            skipped=self._skip,
            grad_norm=self.engine.get_global_grad_norm(),
            ledger=self.ledger() if measure_states else None,
        )

    def ledger(self) -> Ledger | None:
        """The measured ledger, each term at its most over ranks (every rank must call this)."""
        if self._states is None:
            return None
        self._states.terms["activations"] = self._saved_bytes
        return fullest_device(self._states)

    def summary(self, *, step_s: float | None, p2p_s: float | None) -> dict[str, Any] | None:
        """What summary.json keeps about the pipeline: split, schedule, bubble predicted and measured.

        The bubble is (pp - 1) / accum of the ideal step (Narayanan et al. 2021, Sec. 2.2.1),
        so b / (1 + b) of the step as run. Measured: the share of the step rank 0 spent in
        stage-to-stage sends and receives (``time/p2p_s``), the wait for its neighbour stage
        plus the transfers themselves.
        """
        lay = self.layout
        bubble = (lay.pp - 1) / lay.accum_steps
        timed = step_s is not None and math.isfinite(step_s) and step_s > 0
        p2p_share = p2p_s / step_s if timed and p2p_s is not None and step_s else None
        bounds = self.engine.module.parts
        return {
            "stages": lay.pp,
            "layers_per_stage": [int(b - a) for a, b in itertools.pairwise(bounds)],
            "blocks_per_stage": stage_blocks(int(bounds[-1]) - 3, lay.pp),
            "schedule": "1F1B (PipeDream-Flush, Narayanan et al. 2021), flushed every step",
            "micro_batches": lay.accum_steps,
            "bubble_fraction_predicted": bubble,
            "bubble_share_of_step_predicted": bubble / (1 + bubble),
            "p2p_share_of_step_measured": p2p_share,
            "measured_step_s": step_s if timed else None,
        }
