"""The training loop as one object: :class:`Trainer` holds one rank's engine, batches and
instruments, and runs the steps from the resumed one to ``train.steps``.

The path of one step, top to bottom in this file:

- :meth:`Trainer.train`: per step, :meth:`~Trainer.train_step`, then the sinks, a checkpoint
  every ``train.checkpoint_every`` steps and after the last (``train.save_final``;
  runner/train/saving.py), and a stop the ranks agree on;
- :meth:`Trainer.train_step`: the step timed, its metrics (docs/metrics.md), the held-out loss;
- :meth:`Trainer.micro_batch_step` (pp = 1): :meth:`~Trainer.forward_backward_step` on each of
  this rank's micro-batches, then the optimizer step at the accumulation boundary;
- :meth:`Trainer.pipeline_step` (pp > 1): DeepSpeed's PipelineEngine runs forward, backward and
  the optimizer step of every micro-batch itself, 1F1B; runner/train/pipeline_hooks.py has it
  call the step hooks.

Both step functions call the same step hooks at the same seams (runner/train/step_hooks.py):
the non-finite check before the update, the step's measurements, and the hooks a run adds (a
test's faults) are each one hook, written once for both.

What the trainer is built from comes from runner/train/setup.py, in the order the rank needs
it; :class:`Progress` is what the loop has learnt so far, which runner/train/attempt_end.py writes
to summary.json when the attempt ends, however it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runner.checkpoint import save as checkpoint
from runner.checkpoint.size import config_checkpoint_bytes
from runner.config import Precision, ZeroStage
from runner.data.batches import BatchSource, rank_slice
from runner.engine.deepspeed_engine import as_pipeline
from runner.engine.fixes import fp16_stage0_loss_scale as fp16_loss_scale
from runner.engine.optimizer_wrapper import OptimizerWrapper, optimizer_wrapper
from runner.hardware.host_allocator import running_allocator
from runner.hardware.mfu_peak import resolve_peak
from runner.hardware.peak_memory import PeakMemory, host_peak_bytes
from runner.metrics import goodput
from runner.metrics.ledger import TERMS, Estimate, Ledger
from runner.metrics.phase_clock import PHASES, PIPELINE_PHASES, PhaseClock
from runner.metrics.step_probes import StepProbes
from runner.metrics.step_profiler import StepProfiler
from runner.metrics.throughput import throughput_metrics
from runner.metrics.wall_clock import WallClock, wall_parts
from runner.model.activation_offload import checkpoint_offload, offloading
from runner.parallel.sequence import backward_loss
from runner.parallel.tensor import grad_norm as tp_grad_norm
from runner.rundir.summary_records import Evaluated
from runner.train import saving
from runner.train.context import RunContext
from runner.train.evaluation import held_out_loss
from runner.train.nonfinite import NonFiniteGuard, engine_step
from runner.train.over_ranks import max_over_ranks, mean_over_ranks, peaks_over_ranks
from runner.train.pipeline_hooks import PipelineHooks
from runner.train.setup import (
    build_engine,
    extra_step_hooks,
    flops_budget,
    held_out_batches,
    matmuls_for,
    memory_estimate,
    resume,
    sinks_for,
)
from runner.train.step_hooks import StepHookChain
from runner.train.step_measurements import StepMeasurements

log = logging.getLogger("ladder")


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step leaves: its loss (the mean over the global batch, the same on
    every rank), whether its update was skipped for a non-finite loss, its gradient norm, and
    the measured ledger when the step measured it."""

    loss: float
    skipped: bool
    grad_norm: float | None
    ledger: Ledger | None = None
    step_s: float = float("nan")  # the step's wall seconds, timed by train_step


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
    evaluated: Evaluated | None = None  # the latest held-out evaluation of this attempt


def memory_metrics(estimate: Estimate, measured: Ledger | None) -> dict[str, float]:
    """``memory/est/<term>_gb`` always, ``memory/measured/<term>_gb`` once measured (GB = 1e9 B)."""
    metrics = {f"memory/est/{term}_gb": estimate.terms[term] / 1e9 for term in TERMS}
    if measured is not None:
        metrics.update({f"memory/measured/{term}_gb": measured.terms[term] / 1e9 for term in TERMS})
        metrics["memory/measured/residual_gb"] = sum(measured.residual.values()) / 1e9
    return metrics


def _local_grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the gradients this rank holds (the full gradient when nothing is sharded)."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


class Trainer:
    """One rank's training: its engine, batches and instruments, and the loop over the steps."""

    def __init__(self, ctx: RunContext, wall: WallClock, until_return: contextlib.ExitStack) -> None:
        """Build this rank's attempt; ``until_return`` holds what stays entered from the engine's
        construction until the attempt ends (16-bit matmuls in fp32 on a CPU)."""
        config, layout = ctx.config, ctx.layout
        self.ctx = ctx
        self.wall = wall  # where this attempt's time goes
        self.device = ctx.device

        # The model and DeepSpeed's engine (a PipelineEngine when pp > 1), then the checkpoint.
        self.engine, self.model_build, self.compiled_blocks = build_engine(ctx, wall)
        self.activation_offload = checkpoint_offload() if config.model.offload_activations else None
        # From here on, not in the build: its ops need none of it (runner/hardware/cpu_half_matmul.py).
        until_return.enter_context(matmuls_for(ctx))
        self.resumed = resume(ctx, self.engine)
        wall.mark("resume")

        # What MFU divides by, the batches, rank 0's sinks and the memory the ledger expects.
        self.peak = resolve_peak(
            config.cluster, config.precision.name, accelerator=ctx.accelerator, ranks=layout.gpus
        )
        self.peak_flops = mean_over_ranks(
            torch.tensor([self.peak.flops], dtype=torch.float64, device=self.device)
        )
        self.batches = BatchSource(config.data, config.model.vocab_size, config.seed, layout.global_size)
        self.held_out = held_out_batches(ctx)  # None: no evaluation
        self.sinks = sinks_for(ctx)  # rank 0 only
        if ctx.lead:
            log.info("peak FLOP/s per device: %.3g (%s)", self.peak_flops, self.peak.source)
            if ctx.accelerator == "cpu":  # train.host_allocator (runner/hardware/host_allocator.py)
                log.info("host allocator: %s", running_allocator(Path("/proc/self/maps").read_text()))
        self.estimate = memory_estimate(ctx)
        # The step's peak is measured from here: what was built before counts in the host mark only.
        self.peak_memory = PeakMemory(self.device)
        self.host_high_water = host_peak_bytes()  # the build's included: a CPU reset below clears it
        self.peak_memory.reset()

        self._build_step_instruments()
        self.profiler = StepProfiler(
            config.train.profile_step, run_dir=ctx.run_dir, rank=ctx.rank, device=self.device
        )
        wall.mark("setup")

        self.flops = flops_budget(config.model, seq_len=config.data.seq_len)
        self.overflows = fp16_loss_scale.OverflowLog(self.engine, self.resumed.saved("fp16_loss_scale"))
        # Every attempt in this run directory, for goodput across restarts (runner/metrics/goodput.py).
        self.attempt = (
            goodput.AttemptLog(
                ctx.run_dir, started=wall.started, from_step=self.resumed.start_step, launcher=ctx.env.source
            )
            if ctx.lead
            else None
        )
        self.checkpoint_bytes = config_checkpoint_bytes(config)  # to check what a save wrote
        self.progress = Progress(step=self.resumed.start_step)

    def _build_step_instruments(self) -> None:
        """The step's non-finite guard, probes, phase clock and measurements, the hooks the step
        calls, and a pipeline's engine made to call them."""
        ctx, config, layout, engine = self.ctx, self.ctx.config, self.ctx.layout, self.engine
        self.nonfinite = NonFiniteGuard(  # train.on_nonfinite: stop, or skip the update
            config.train.on_nonfinite,
            max_skipped=config.train.max_skipped_steps,
            skipped=self.resumed.saved("skipped_steps") or [],
        )
        # The noise scale and exposed communication, read as the step runs (runner/metrics/step_probes.py).
        self.probes = StepProbes(
            engine, layout=layout, device=self.device, tied_embeddings=config.model.tie_embeddings
        )
        if self.resumed.saved("noise_scale"):  # its EMAs go on where the checkpoint left them
            self.probes.noise.restore(self.resumed.saved("noise_scale"))
        # Where each step's time goes (runner/metrics/phase_clock.py); a pipeline marks its instructions.
        self.clock = PhaseClock(self.device, PHASES if layout.pp == 1 else PIPELINE_PHASES)
        self.precision: Precision = config.precision.name
        self.measurements = StepMeasurements(engine, probes=self.probes, precision=self.precision)
        # What the step calls at its seams (runner/train/step_hooks.py), in this order: the
        # non-finite check before the model states are measured at the boundary, then the hooks
        # the run adds (LADDER_STEP_HOOKS: a test's faults).
        extra = extra_step_hooks(ctx.rank, os.environ)
        self.hooks = StepHookChain([self.nonfinite, self.measurements, *extra])
        # DeepSpeed reports no global grad norm where torch's optimizer steps unwrapped (stage 0
        # in fp32); there every rank holds the full all-reduced gradient at the boundary, so the
        # norm is computed from it directly.
        wrapper = optimizer_wrapper(
            precision=self.precision, zero_stage=config.parallel.zero_stage, pp=layout.pp
        )
        self.own_grad_norm = layout.pp == 1 and wrapper is OptimizerWrapper.none
        self.pipeline: PipelineHooks | None = None
        # This rank's data-parallel rank: under a pipeline from DeepSpeed's topology (pipe-major rank order).
        self.dp_rank = ctx.dp_rank
        if layout.pp > 1:
            pipeline = as_pipeline(engine)
            self.dp_rank = int(pipeline.grid.get_data_parallel_id())
            self.pipeline = PipelineHooks(
                pipeline, hooks=self.hooks, clock=self.clock, accum_steps=layout.accum_steps
            )

    # The loop.

    def train(self) -> None:
        """Train from the resumed step to ``train.steps``; raises Preempted at an agreed stop."""
        ctx, wall, progress = self.ctx, self.wall, self.progress
        every, last = ctx.config.train.checkpoint_every, ctx.config.train.steps
        final = ctx.config.train.save_final
        for step in range(self.resumed.start_step, ctx.config.train.steps):
            progress.step = step
            metrics = self.train_step()
            logged = self._log(step, metrics)
            self.hooks.after_step(step)
            asked = self._asked_to_stop(step)
            saving_now = bool((every and (step + 1) % every == 0) or asked or (final and step + 1 == last))
            if saving_now:
                self.save(completed_steps=step + 1)
            if self.attempt is not None:
                self.attempt.progress(
                    step + 1, wall.steps_s, saved=saving_now, logged=logged, parts=lambda: wall_parts(wall)
                )
            if asked and ctx.stop is not None:
                raise saving.stopped(ctx, step + 1, asked, ctx.stop)

    def train_step(self) -> dict[str, Any]:
        """One optimizer step, timed, and its metrics (the held-out loss among them when evaluated)."""
        progress = self.progress
        lr = self.engine.get_lr()[0]
        loss_scale = fp16_loss_scale.current_scale(self.engine)  # what this step's backward multiplies by
        outcome = self._timed_step()
        progress.ledger = outcome.ledger or progress.ledger
        metrics = self._step_metrics(outcome, lr=lr, loss_scale=loss_scale)
        # An fp16 overflow's step (its norm inf) is skipped by DeepSpeed's loss scaler.
        grad_norm = outcome.grad_norm
        overflowed = grad_norm is not None and not math.isfinite(grad_norm)
        progress.updated = progress.updated or not (outcome.skipped or overflowed)
        metrics.update(memory_metrics(self.estimate, progress.ledger))
        if (eval_loss := self._evaluate()) is not None:
            metrics["eval/loss"] = eval_loss
        progress.last = metrics
        return metrics

    def _timed_step(self) -> StepOutcome:
        """Run one step through the layout's step function; its outcome, timed."""
        step, steps, progress = self.progress.step, self.ctx.config.train.steps, self.progress
        self.hooks.before_step(step)
        self.probes.step_started()
        self.profiler.step_started(step)
        started = time.perf_counter()
        self.clock.start()
        if progress.ledger_step is None and (progress.updated or step == steps - 1):
            progress.ledger_step = step
        self.measurements.expect(
            states=step == progress.ledger_step, activations=step == self.resumed.start_step
        )
        # DeepSpeed's PipelineEngine schedules a pipeline's micro-batches itself; without one,
        # the rank runs them.
        run_step = self.pipeline_step if self.pipeline is not None else self.micro_batch_step
        outcome = run_step(step)
        ledger = self.measurements.ledger()  # on every rank: the most over ranks is a collective
        self.clock.mark("other")
        if self.device.type == "cuda":
            # The optimizer's kernels are still queued (bf16 ZeRO syncs nowhere in its step):
            # they are this step's time. The metrics below would wait for them anyway.
            torch.cuda.synchronize(self.device)
        step_s = time.perf_counter() - started
        self.wall.step(step_s)
        self.profiler.step_done(step)
        return dataclasses.replace(outcome, ledger=ledger, step_s=step_s)

    # The step without a pipeline (pp = 1).

    def micro_batch_step(self, step: int) -> StepOutcome:
        """Forward and backward over each of this rank's micro-batches, then the optimizer step.

        DeepSpeed reduces the gradients and steps the optimizer at the accumulation boundary
        only (``engine.step`` is a no-op before it).
        """
        engine, clock, hooks, accum_steps = self.engine, self.clock, self.hooks, self.ctx.layout.accum_steps
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        loss_value, skip, grad_norm = float("nan"), False, None
        for micro, (inputs, targets) in enumerate(self.micro_batches(self.batches, step)):
            clock.mark("data")
            loss = self.forward_backward_step(inputs, targets, step=step, micro=micro)
            loss_sum += loss.detach().float()
            hooks.after_backward(step, micro)
            clock.mark("other")
            if micro == accum_steps - 1:
                # Decided before the optimizer step: a non-finite loss never reaches the
                # weights; it stops the run or skips the update, the same on every rank.
                loss_value = mean_over_ranks(loss_sum / accum_steps)
                skip = hooks.before_update(step, loss_value)
                grad_norm = self._grad_norm() if self.own_grad_norm else None
            engine_step(engine, skip=skip)  # DeepSpeed steps at the accumulation boundary only
            clock.mark("optimizer")
        if not self.own_grad_norm:
            grad_norm = engine.get_global_grad_norm()
        return StepOutcome(loss=loss_value, skipped=skip, grad_norm=grad_norm)

    def forward_backward_step(
        self, inputs: torch.Tensor, targets: torch.Tensor, *, step: int, micro: int
    ) -> torch.Tensor:
        """Micro-batch ``micro``'s forward and backward, the step's hooks called between; its loss."""
        engine, hooks = self.engine, self.hooks
        # model.offload_activations: the checkpointed blocks' inputs wait on the host from this
        # forward to its backward (runner/model/activation_offload.py).
        offload = self.activation_offload
        with offloading(offload) if offload is not None else contextlib.nullcontext():
            with hooks.forward(step, micro):
                loss = engine(inputs, targets)  # the model's forward forms the loss (Transformer.forward)
            loss = hooks.loss(step, micro, loss)
            self.clock.mark("forward")
            stage = ZeroStage(self.ctx.config.parallel.zero_stage)
            engine.backward(backward_loss(loss, sp=self.ctx.layout.sp, zero_stage=stage))
        self.clock.mark("backward")
        return loss

    def _grad_norm(self) -> float:
        """The whole model's gradient norm at the boundary (stage 0, fp32; shards summed over tp)."""
        module, tp = self.engine.module, self.ctx.layout.tp
        return _local_grad_norm(module) if tp == 1 else tp_grad_norm(module, tp=tp)

    # The step through a pipeline (pp > 1).

    def pipeline_step(self, step: int) -> StepOutcome:
        """DeepSpeed's ``PipelineEngine.train_batch``: forward, backward and the optimizer step of
        every micro-batch, 1F1B (runner/parallel/pipeline.py). The engine calls the step's hooks
        from inside (runner/train/pipeline_hooks.py) and times each instruction's phase."""
        pipeline = self.pipeline
        assert pipeline is not None  # pp > 1 (the step function is chosen in _timed_step)
        loss = pipeline.train_batch(step, self.micro_batches(self.batches, step))
        return StepOutcome(
            loss=loss, skipped=pipeline.skipped, grad_norm=pipeline.engine.get_global_grad_norm()
        )

    # What both step functions share.

    def micro_batches(self, source: BatchSource, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of ``step`` (or of held-out batch ``step``), on its device:
        the sequences every layout sees (runner/data/batches.py)."""
        layout = self.ctx.layout
        for micro in range(layout.accum_steps):
            start = rank_slice(self.dp_rank, micro, layout.micro_size, layout.accum_steps)
            inputs, targets = source.micro_batch(step, start, layout.micro_size)
            yield inputs.to(self.device), targets.to(self.device)

    def _step_metrics(self, outcome: StepOutcome, *, lr: float, loss_scale: float | None) -> dict[str, Any]:
        """The step's metrics, before any evaluation (the names of docs/metrics.md)."""
        ctx, grad_norm, step = self.ctx, outcome.grad_norm, self.progress.step
        measured = self.probes.step_done(grad_norm=grad_norm, skipped=outcome.skipped)
        self.overflows.step_done(step, grad_norm=grad_norm, skipped=outcome.skipped)
        return {
            "loss": outcome.loss,
            "lr": lr,
            "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            **measured,
            **self.clock.seconds(),
            "train/skipped_steps": len(self.nonfinite.skipped),
            **({"train/loss_scale": loss_scale} if loss_scale is not None else {}),
            **throughput_metrics(
                step_s=outcome.step_s,
                tokens_per_step=ctx.layout.global_size * ctx.config.data.seq_len,
                n_devices=ctx.layout.gpus,
                flops=self.flops,
                peak_flops=self.peak_flops,
            ),
            **peaks_over_ranks(self.peak_memory.read(), self.host_high_water, self.device),
        }

    def _evaluate(self) -> float | None:
        """The held-out loss after every ``train.eval_every`` steps and after the last (None: not now)."""
        train, done = self.ctx.config.train, self.progress.step + 1
        if self.held_out is None or (done % train.eval_every != 0 and done != train.steps):
            return None
        evaluating = time.perf_counter()
        loss = self._held_out_loss(self.held_out, batches=train.eval_batches)
        self.wall.evaluation(time.perf_counter() - evaluating)
        self.progress.evaluated = {"loss": loss, "step": done}
        return loss

    def _held_out_loss(self, held_out: BatchSource, *, batches: int) -> float:
        """The mean held-out loss over ``batches`` global batches (runner/train/evaluation.py), the
        same on every rank. Under a pipeline DeepSpeed's ``eval_batch`` averages each over its
        micro-batches and the pipelines and broadcasts it from the last stage."""
        if self.pipeline is None:
            layout = self.ctx.layout
            return held_out_loss(
                self.engine,
                held_out,
                batches=batches,
                layout=layout,
                dp_rank=self.dp_rank,
                device=self.device,
            )
        total = 0.0
        for batch in range(batches):
            total += float(self.pipeline.engine.eval_batch(data_iter=self.micro_batches(held_out, batch)))
        return total / batches

    # After the step: the sinks, a stop, a checkpoint.

    def _log(self, step: int, metrics: dict[str, Any]) -> bool:
        """Hand the step's metrics to rank 0's sinks every ``logger.log_every`` steps and at the last."""
        config = self.ctx.config
        logged = step % config.logger.log_every == 0 or step == config.train.steps - 1
        if logged:
            for sink in self.sinks:
                sink.log(step, metrics)
        return logged

    def _asked_to_stop(self, step: int) -> int:
        """What the ranks agree a stop signal asks after ``step`` (0: go on; none after the last step).

        Under SLURM and the local launcher the ranks agree after every step but the last whether
        a signal asks them to stop (runner/train/preemption.py): then they save and leave.
        """
        ctx = self.ctx
        if ctx.stop is None or step + 1 == ctx.config.train.steps:
            return 0
        return int(max_over_ranks(ctx.stop.asked, self.device))

    def save(self, *, completed_steps: int) -> None:
        """A checkpoint after ``completed_steps``, with the loop's state a resume goes on from."""
        record = checkpoint.SaveRecord(
            completed_steps=completed_steps,
            layout=self.ctx.layout,
            zero_stage=self.ctx.config.parallel.zero_stage,
            skipped_steps=tuple(self.nonfinite.skipped),
            noise_scale=self.probes.noise.state(),
            loss_scale=self.overflows.state(),
        )
        saving.save(self.ctx, self.wall, self.engine, record, expected_bytes=self.checkpoint_bytes)
