"""An optimizer step without a pipeline: the batch contract's micro-batches, one after another.

Each micro-batch runs forward and backward through DeepSpeed's engine; DeepSpeed reduces the
gradients and steps the optimizer at the accumulation boundary only (``engine.step`` is a
no-op before it). A non-finite loss is caught at the boundary, before the optimizer step, so
it never reaches the weights (runner/train/nonfinite.py).
"""

from __future__ import annotations

from typing import Any

import torch

from runner.config import Precision
from runner.data.batches import BatchSource, rank_slice
from runner.metrics.ledger import Ledger, fullest_device, measure_model_states, saved_activations
from runner.parallel.tensor import grad_norm as tp_grad_norm
from runner.train.context import RunContext
from runner.train.evaluation import held_out_loss
from runner.train.nonfinite import engine_step
from runner.train.over_ranks import mean_over_ranks
from runner.train.step import StepOutcome, StepParts


def _local_grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the gradients this rank holds (the full gradient when nothing is sharded)."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


class MicroBatchSteps:
    """pp = 1: this rank's micro-batches of each step through DeepSpeed's engine."""

    def __init__(self, ctx: RunContext, parts: StepParts) -> None:
        self.engine = parts.engine
        self.parts = parts
        self.layout = ctx.layout
        self.dp_rank = ctx.dp_rank
        self.device = ctx.device
        self.precision = ctx.config.precision.name
        # DeepSpeed reports no global grad norm at stage 0 in fp32; there every rank holds the
        # full all-reduced gradient at the boundary, so the norm is computed from it directly.
        self.own_grad_norm = ctx.config.parallel.zero_stage == 0 and self.precision == Precision.fp32
        self.saved_bytes = 0  # what the first micro-batch of the attempt saved for backward

    def _forward(self, inputs: torch.Tensor, targets: torch.Tensor, *, measure: bool) -> torch.Tensor:
        """The micro-batch's loss; ``measure``: count the bytes its forward saves for backward."""
        engine = self.engine
        if not measure:
            return engine.module.loss_function(engine(inputs), shift_labels=targets)
        with saved_activations(engine.module) as saved:
            loss = engine.module.loss_function(engine(inputs), shift_labels=targets)
        self.saved_bytes = saved["activations"]
        return loss

    def _grad_norm(self) -> float:
        """The whole model's gradient norm at the boundary (stage 0, fp32; shards summed over tp)."""
        module, tp = self.engine.module, self.layout.tp
        return _local_grad_norm(module) if tp == 1 else tp_grad_norm(module, tp=tp)

    def _measured(self) -> Ledger:
        """The model states at the boundary and the first micro-batch's activations, at their most
        over ranks (every rank must call this)."""
        ledger = measure_model_states(self.engine, precision=self.precision)
        ledger.terms["activations"] = self.saved_bytes
        return fullest_device(ledger)

    def run(self, step: int, *, measure_states: bool, measure_activations: bool) -> StepOutcome:
        """Forward and backward over each micro-batch, then the optimizer step at the boundary."""
        lay, parts = self.layout, self.parts
        clock = parts.clock
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        loss_value, skip, grad_norm, ledger = float("nan"), False, None, None
        for micro in range(lay.accum_steps):
            start = rank_slice(self.dp_rank, micro, lay.micro_size, lay.accum_steps)
            inputs, targets = parts.batches.micro_batch(step, start, lay.micro_size)
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            clock.mark("data")
            loss = self._forward(inputs, targets, measure=measure_activations and micro == 0)
            if step in parts.nan_steps:
                loss = loss * float("nan")  # LADDER_INJECT_NAN (tests of train.on_nonfinite)
            clock.mark("forward")
            self.engine.backward(loss)
            clock.mark("backward")
            loss_sum += loss.detach().float()
            parts.probes.micro_batch_done(self.engine)
            clock.mark("other")
            if micro == lay.accum_steps - 1:
                # Checked before the optimizer step: a non-finite loss never reaches the
                # weights; it stops the run or skips the update, the same on every rank.
                loss_value = mean_over_ranks(loss_sum / lay.accum_steps)
                skip = parts.nonfinite.should_skip(loss_value, step=step)
                grad_norm = self._grad_norm() if self.own_grad_norm else None
                ledger = self._measured() if measure_states else None
            engine_step(self.engine, skip=skip)  # DeepSpeed steps at the accumulation boundary only
            clock.mark("optimizer")
        if not self.own_grad_norm:
            grad_norm = self.engine.get_global_grad_norm()
        return StepOutcome(loss=loss_value, skipped=skip, grad_norm=grad_norm, ledger=ledger)

    def eval_loss(self, held_out: BatchSource, *, batches: int) -> float:
        """The mean held-out loss over ``batches`` global batches (runner/train/evaluation.py)."""
        return held_out_loss(
            self.engine,
            held_out,
            batches=batches,
            layout=self.layout,
            dp_rank=self.dp_rank,
            device=self.device,
        )

    def summary(self, *, step_s: float | None, p2p_s: float | None) -> dict[str, Any] | None:
        """No pipeline: nothing to add to summary.json."""
        return None
