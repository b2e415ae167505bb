"""The training loop: run a step, measure it, log it, evaluate, save, and stop when asked.

One step's metrics are those of docs/metrics.md: the loss, the learning rate, the gradient
norm, the step's time by phase, throughput and MFU (runner/metrics/throughput.py), the
memory peaks and the ledger's terms. :class:`Progress` is what the loop has learnt so far;
runner/train/record.py writes it to summary.json when the attempt ends, however it ends.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from runner.engine.fixes import fp16_stage0_loss_scale as fp16_loss_scale
from runner.metrics.ledger import TERMS, Estimate, Ledger
from runner.metrics.throughput import throughput_metrics
from runner.metrics.wall_clock import WallClock, wall_parts
from runner.train import saving
from runner.train.context import RunContext
from runner.train.over_ranks import max_over_ranks, peaks_over_ranks
from runner.train.setup import Setup
from runner.train.step import StepOutcome


@dataclass
class Progress:
    """What the loop has done so far in this attempt."""

    step: int  # the step running, or the last one started
    last: dict[str, float] = field(default_factory=dict)  # the latest step's metrics
    ledger: Ledger | None = None  # the measured ledger, once measured
    # Model states are measured at the accumulation boundary of the first step after one that
    # updated the weights, when the optimizer state exists (the second step, unless fp16's
    # loss scaler or train.on_nonfinite=skip skipped the first), or of the last step;
    # activations over the first micro-batch of the first step.
    ledger_step: int | None = None
    updated: bool = False  # some step of this attempt applied its update
    evaluated: dict[str, Any] | None = None  # the latest held-out evaluation of this attempt


def memory_metrics(estimate: Estimate, measured: Ledger | None) -> dict[str, float]:
    """``memory/est/<term>_gb`` always, ``memory/measured/<term>_gb`` once measured (GB = 1e9 B)."""
    metrics = {f"memory/est/{term}_gb": estimate.terms[term] / 1e9 for term in TERMS}
    if measured is not None:
        metrics.update({f"memory/measured/{term}_gb": measured.terms[term] / 1e9 for term in TERMS})
        metrics["memory/measured/residual_gb"] = sum(measured.residual.values()) / 1e9
    return metrics


def _step_metrics(
    ctx: RunContext, setup: Setup, outcome: StepOutcome, *, step: int, lr: float, loss_scale: float | None
) -> dict[str, Any]:
    """The step's metrics, before any evaluation (the names of docs/metrics.md)."""
    layout, grad_norm, parts = ctx.layout, outcome.grad_norm, setup.parts
    measured = parts.probes.step_done(grad_norm=grad_norm, skipped=outcome.skipped)
    setup.overflows.step_done(step, grad_norm=grad_norm, skipped=outcome.skipped)
    return {
        "loss": outcome.loss,
        "lr": lr,
        "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
        **measured,
        **parts.clock.seconds(),
        "train/skipped_steps": len(parts.nonfinite.skipped),
        **({"train/loss_scale": loss_scale} if loss_scale is not None else {}),
        **throughput_metrics(
            step_s=outcome.step_s,
            tokens_per_step=layout.global_size * ctx.config.data.seq_len,
            n_devices=layout.gpus,
            flops=setup.flops,
            peak_flops=setup.peak_flops,
        ),
        **peaks_over_ranks(setup.peak_memory.read(), setup.host_high_water, ctx.device),
    }


def _timed_step(ctx: RunContext, setup: Setup, progress: Progress, wall: WallClock) -> StepOutcome:
    """Run one step through the layout's implementation; its outcome, timed."""
    step, steps = progress.step, ctx.config.train.steps
    if step == setup.fault_step:
        raise RuntimeError(f"fault injected by LADDER_INJECT_FAULT on rank {ctx.rank} at step {step}")
    setup.parts.probes.step_started()
    setup.profiler.step_started(step)
    started = time.perf_counter()
    setup.parts.clock.start()
    if progress.ledger_step is None and (progress.updated or step == steps - 1):
        progress.ledger_step = step
    outcome = setup.steps.run(
        step,
        measure_states=step == progress.ledger_step,
        measure_activations=step == setup.resumed.start_step,
    )
    setup.parts.clock.mark("other")
    if ctx.device.type == "cuda":
        # The optimizer's kernels are still queued (bf16 ZeRO syncs nowhere in its step):
        # they are this step's time. The metrics below would wait for them anyway.
        torch.cuda.synchronize(ctx.device)
    step_s = time.perf_counter() - started
    wall.step(step_s)
    setup.profiler.step_done(step)
    return dataclasses.replace(outcome, step_s=step_s)


def _evaluate(ctx: RunContext, setup: Setup, progress: Progress, wall: WallClock) -> float | None:
    """The held-out loss after every ``train.eval_every`` steps and after the last (None: not now)."""
    train, done = ctx.config.train, progress.step + 1
    if setup.held_out is None or (done % train.eval_every != 0 and done != train.steps):
        return None
    evaluating = time.perf_counter()
    loss = setup.steps.eval_loss(setup.held_out, batches=train.eval_batches)
    wall.evaluation(time.perf_counter() - evaluating)
    progress.evaluated = {"loss": loss, "step": done}
    return loss


def _one_step(ctx: RunContext, setup: Setup, progress: Progress, wall: WallClock) -> dict[str, Any]:
    """One optimizer step and its metrics."""
    step = progress.step
    lr = setup.engine.get_lr()[0]
    loss_scale = fp16_loss_scale.current_scale(setup.engine)  # what this step's backward multiplies by
    outcome = _timed_step(ctx, setup, progress, wall)
    progress.ledger = outcome.ledger or progress.ledger
    metrics = _step_metrics(ctx, setup, outcome, step=step, lr=lr, loss_scale=loss_scale)
    # An fp16 overflow's step (its norm inf) is skipped by DeepSpeed's loss scaler.
    grad_norm = outcome.grad_norm
    overflowed = grad_norm is not None and not math.isfinite(grad_norm)
    progress.updated = progress.updated or not (outcome.skipped or overflowed)
    metrics.update(memory_metrics(setup.estimate, progress.ledger))
    if (eval_loss := _evaluate(ctx, setup, progress, wall)) is not None:
        metrics["eval/loss"] = eval_loss
    progress.last = metrics
    return metrics


def _log(ctx: RunContext, setup: Setup, step: int, metrics: dict[str, Any]) -> bool:
    """Hand the step's metrics to rank 0's sinks every ``logger.log_every`` steps and at the last."""
    logged = step % ctx.config.logger.log_every == 0 or step == ctx.config.train.steps - 1
    if logged:
        for sink in setup.sinks:
            sink.log(step, metrics)
    return logged


def _asked_to_stop(ctx: RunContext, step: int) -> int:
    """What the ranks agree a stop signal asks after ``step`` (0: go on; none after the last step).

    Under SLURM and the local launcher the ranks agree after every step but the last whether
    a signal asks them to stop (runner/train/preemption.py): then they save and leave.
    """
    if ctx.stop is None or step + 1 == ctx.config.train.steps:
        return 0
    return int(max_over_ranks(ctx.stop.asked, ctx.device))


def injected_step_s() -> float:
    """Seconds ``LADDER_INJECT_STEP_S`` adds after each step (tests: a time limit that lands mid-run)."""
    return float(os.environ.get("LADDER_INJECT_STEP_S") or 0)


def train_steps(ctx: RunContext, setup: Setup, progress: Progress, wall: WallClock) -> None:
    """Train from the resumed step to ``train.steps``; raises Preempted at an agreed stop."""
    every = ctx.config.train.checkpoint_every
    slow_s = injected_step_s()
    for step in range(setup.resumed.start_step, ctx.config.train.steps):
        progress.step = step
        metrics = _one_step(ctx, setup, progress, wall)
        logged = _log(ctx, setup, step, metrics)
        time.sleep(slow_s)
        asked = _asked_to_stop(ctx, step)
        saving_now = bool((every and (step + 1) % every == 0) or asked)
        if saving_now:
            saving.save(ctx, setup, wall, completed_steps=step + 1)
        if setup.attempt is not None:
            setup.attempt.progress(
                step + 1, wall.steps_s, saved=saving_now, logged=logged, parts=lambda: wall_parts(wall)
            )
        if asked and ctx.stop is not None:
            raise saving.stopped(ctx, step + 1, asked, ctx.stop)
