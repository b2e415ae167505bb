"""Inside a pipeline's step: where DeepSpeed's PipelineEngine calls the step hooks.

``PipelineEngine.train_batch`` runs forward, backward and the optimizer step of all the batch
contract's micro-batches, 1F1B (runner/parallel/pipeline.py has the schedule and its sources).
The step hooks (runner/train/step_hooks.py) that the trainer calls from its own loop without a
pipeline are called here from inside the engine, at the same seams:

- a micro-batch's forward: this stage module's ``forward``, and a last stage's ``loss_fn``,
  which the engine calls apart from it (the hooks' ``forward`` around each, then their ``loss``);
- a micro-batch's backward: the schedule's BackwardPass instruction;
- the boundary: the engine's ``_take_model_step``, which the OptimizerStep instruction calls:
  the hooks' ``before_update`` first sees the step's loss and may skip the update.

Each instruction's time is marked in the step's phase clock too. The trainer
(runner/train/trainer.py ``Trainer.pipeline_step``) runs ``train_batch`` through
:meth:`PipelineHooks.train_batch`; outside it (``eval_batch``) no hook is called.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from runner.engine.deepspeed_engine import PipelineEngine, pipeline_stages
from runner.layout import Layout
from runner.metrics.phase_clock import PhaseClock
from runner.parallel.pipeline_split import stage_blocks
from runner.rundir.summary_records import PipelineRecord
from runner.train.nonfinite import skipping
from runner.train.step_hooks import StepHooks

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
    """A PipelineEngine made to call the step hooks from inside ``train_batch`` and to time its
    instructions."""

    def __init__(
        self, engine: PipelineEngine, *, hooks: StepHooks, clock: PhaseClock, accum_steps: int
    ) -> None:
        self.engine = engine
        self.hooks = hooks
        self.accum_steps = accum_steps
        self.step: int | None = None  # the step train_batch is running (None: none is)
        self.skipped = False  # this step's update was skipped (train.on_nonfinite=skip)
        # This step's micro-batches whose forward has started, and whose backward has run, on
        # this stage: 1F1B runs each stage's forwards, and its backwards, in micro-batch order.
        self._forwards = 0
        self._backwards = 0
        self._call_around_forward(engine)
        self._call_before_update(engine)
        self._run_instructions(engine, clock)

    def train_batch(self, step: int, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """DeepSpeed's ``train_batch`` over ``batches`` as step ``step``, the hooks called inside;
        the step's loss (DeepSpeed averages the last stages' over the micro-batches and the
        pipelines, and broadcasts it)."""
        self.step, self.skipped = step, False
        self._forwards = self._backwards = 0
        try:
            return float(self.engine.train_batch(data_iter=batches))
        finally:
            self.step = None

    def _call_around_forward(self, engine: PipelineEngine) -> None:
        """Enter the hooks' ``forward`` around this stage's forward of each micro-batch, and on a
        last stage around its loss too, whose value then passes through the hooks' ``loss``."""
        module, stages = engine.module, pipeline_stages(engine)
        forward, loss_fn = module.forward, stages.loss_fn

        def forward_in_hooks(*args: Any) -> Any:
            if self.step is None:
                return forward(*args)
            micro = self._forwards
            self._forwards += 1
            with self.hooks.forward(self.step, micro):
                return forward(*args)

        module.forward = forward_in_hooks
        if loss_fn is None or not engine.is_last_stage():
            return

        def loss_in_hooks(*args: Any) -> torch.Tensor:
            if self.step is None:
                return loss_fn(*args)
            micro = self._forwards - 1  # the engine forms a micro-batch's loss after its forward
            with self.hooks.forward(self.step, micro):
                loss = loss_fn(*args)
            return self.hooks.loss(self.step, micro, loss)

        stages.loss_fn = loss_in_hooks

    def _call_before_update(self, engine: PipelineEngine) -> None:
        """The optimizer step runs inside train_batch: wrap it so that the hooks' ``before_update``
        sees the step's loss just before it, at the accumulation boundary, as the trainer calls it
        without a pipeline; a skipped update runs with no update (runner/train/nonfinite.py)."""
        take_model_step = engine._take_model_step

        def at_boundary(*args: Any, **kwargs: Any) -> Any:
            assert self.step is not None  # only train_batch steps the optimizer
            self.skipped = self.hooks.before_update(self.step, self._mean_loss(engine))
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
            local[0] = engine.total_loss.detach().double() / self.accum_steps
            local[1] = 1.0
        torch.distributed.all_reduce(local)
        return float(local[0] / local[1])

    def _run_instructions(self, engine: PipelineEngine, clock: PhaseClock) -> None:
        """Mark ``clock`` around each instruction the engine runs, under the instruction's phase,
        and call the hooks' ``after_backward`` once each BackwardPass has run.

        ``PipelineEngine._exec_schedule`` looks every instruction up in ``self._INSTRUCTION_MAP``
        (DeepSpeed 0.19.8); an instance attribute of the same name takes the class's place.
        """

        def timed(kind: type, run: Callable[..., Any]) -> Callable[..., Any]:
            phase = _INSTRUCTION_PHASES.get(kind.__name__, "other")
            backward = kind.__name__ == "BackwardPass"

            def run_timed(engine: PipelineEngine, **kwargs: Any) -> Any:
                clock.mark("other")  # the engine's own work since the last instruction
                result = run(engine, **kwargs)
                clock.mark(phase)
                if backward and self.step is not None:
                    self.hooks.after_backward(self.step, self._backwards)
                    self._backwards += 1
                return result

            return run_timed

        engine._INSTRUCTION_MAP = {
            kind: timed(kind, run) for kind, run in type(engine)._INSTRUCTION_MAP.items()
        }


def pipeline_summary(
    engine: PipelineEngine, layout: Layout, *, step_s: float | None, p2p_s: float | None
) -> PipelineRecord:
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
