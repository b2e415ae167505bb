"""Everything one rank builds before its first step: model, engine, resume, batches, instruments.

:func:`set_up` returns a :class:`Setup`; the loop (runner/train/loop.py) runs steps with it
and runner/train/record.py writes summary.json from it. Each part is built by its own small
function below, in the order the rank needs them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from runner.checkpoint import restore
from runner.checkpoint.resume_rules import resume_tag
from runner.config import ModelConfig, to_dict
from runner.data.batches import BatchSource
from runner.engine.build import build_measured
from runner.engine.compile_blocks import compile_blocks
from runner.engine.fixes import fp16_stage0_loss_scale as fp16_loss_scale
from runner.engine.initialize import before_build, initialize_engine
from runner.flops import flops_per_token, non_embedding_params, recompute_flops_per_token
from runner.hardware.cpu_half_matmul import computes_in_fp32, half_matmuls_in_fp32
from runner.hardware.mfu_peak import Peak, resolve_peak
from runner.hardware.peak_flops import torch_dtype
from runner.hardware.peak_memory import PeakMemory, host_peak_bytes
from runner.metrics import goodput
from runner.metrics.ledger import Estimate, RankBatch, deepspeed_estimate
from runner.metrics.phase_clock import PHASES, PIPELINE_PHASES, PhaseClock
from runner.metrics.sinks import MetricSink, build_sinks
from runner.metrics.step_probes import StepProbes
from runner.metrics.step_profiler import StepProfiler
from runner.metrics.throughput import FlopsBudget
from runner.metrics.wall_clock import WallClock
from runner.model.transformer import num_params
from runner.plan.checkpoint_size import config_checkpoint_bytes
from runner.rundir import checkpoint_record
from runner.train.context import RunContext
from runner.train.micro_steps import MicroBatchSteps
from runner.train.nonfinite import NonFiniteGuard, injected_nan_steps
from runner.train.over_ranks import mean_over_ranks
from runner.train.pipeline_steps import PipelineSteps
from runner.train.preemption import resumes
from runner.train.step import StepParts, Steps

log = logging.getLogger("ladder")


@dataclass(frozen=True)
class Resumed:
    """Where this attempt starts: the completed steps, and the checkpoint's record (None: from scratch)."""

    start_step: int = 0
    record: dict[str, Any] | None = None

    def saved(self, key: str) -> Any:
        """A field the checkpoint's record keeps (None from scratch or where it has none)."""
        return None if self.record is None else self.record.get(key)


@dataclass(frozen=True)
class Setup:
    """What one rank built for its attempt; the loop and the summary read it."""

    engine: Any
    steps: Steps  # pp = 1 or pp > 1 (runner/train/step.py)
    parts: StepParts
    resumed: Resumed
    model_build: dict[str, Any]  # summary.json's model_build (runner/engine/build.py)
    compiled_blocks: int  # train.compile: blocks compiled; 0 otherwise
    peak: Peak  # the peak FLOP/s MFU divides by, and where it came from
    peak_flops: float  # that peak, averaged over the ranks
    flops: FlopsBudget
    held_out: BatchSource | None  # train.eval_every > 0: the held-out sequences
    overflows: fp16_loss_scale.OverflowLog
    estimate: Estimate  # the ledger's estimate, by term (runner/metrics/ledger.py)
    peak_memory: PeakMemory
    host_high_water: int  # the process's high-water RSS before training, the build's included
    profiler: StepProfiler
    sinks: list[MetricSink]  # rank 0 only
    attempt: goodput.AttemptLog | None  # rank 0 only: this attempt in the run's goodput log
    checkpoint_bytes: int  # one checkpoint's planned bytes, to check what a save wrote
    fault_step: int | None  # LADDER_INJECT_FAULT (tests of failure)


def flops_budget(model: ModelConfig, *, seq_len: int) -> FlopsBudget:
    """FLOPs per token under both conventions (N: the parameters that do matmul work)."""
    matmul_params = non_embedding_params(
        num_params(model),
        vocab_size=model.vocab_size,
        d_model=model.d_model,
        tie_embeddings=model.tie_embeddings,
    )
    common: dict[str, Any] = dict(
        num_params=matmul_params,
        n_layers=model.n_layer,
        d_model=model.d_model,
        seq_len=seq_len,
    )
    return FlopsBudget(
        per_token=flops_per_token(**common, causal=False),
        per_token_causal=flops_per_token(**common, causal=True),
        recompute_per_token=recompute_flops_per_token(
            **common, recompute=model.activation_checkpointing.value
        ),
    )


def injected_fault(rank: int) -> int | None:
    """The step at which ``LADDER_INJECT_FAULT=<rank>:<step>`` makes this rank raise (tests of failure)."""
    spec = os.environ.get("LADDER_INJECT_FAULT", "")
    if ":" not in spec:
        return None
    fault_rank, fault_step = spec.split(":", 1)
    return int(fault_step) if int(fault_rank) == rank else None


@contextlib.contextmanager
def matmuls_for(ctx: RunContext) -> Iterator[None]:
    """16-bit matmuls in fp32 on a CPU whose torch has no 16-bit GEMM kernels for it
    (runner/hardware/cpu_half_matmul.py); rank 0 says so. A compiled run keeps torch's own kernels."""
    config, device = ctx.config, ctx.device
    dtype = torch_dtype(config.precision.name)
    if not computes_in_fp32(dtype, device_type=device.type):
        yield
        return
    name = config.precision.name.value
    if config.train.compile:
        if ctx.lead:
            log.warning(
                "%s matmuls on this CPU run on torch's reference kernel (it has no %s GEMM kernels for "
                "this CPU), many times slower than fp32; train.compile=true keeps them there, since "
                "torch.compile does not trace under the fp32 matmuls uncompiled runs get",
                name,
                name,
            )
        yield
        return
    if ctx.lead:
        log.info(
            "%s matmuls computed in fp32 and rounded to %s: torch has no %s GEMM kernels for this CPU",
            name,
            name,
            name,
        )
    with half_matmuls_in_fp32(dtype, device_type=device.type):
        yield


def build_engine(ctx: RunContext, wall: WallClock) -> tuple[Any, dict[str, Any], int]:
    """The model built for the layout (compiled blocks with train.compile), then DeepSpeed's engine
    with its faults fixed; the build's record and the blocks compiled."""
    config = ctx.config
    before_build()
    torch.manual_seed(config.seed)
    model, model_build = build_measured(
        config, layout=ctx.layout, ds_config=ctx.job.ds_config, device=ctx.device
    )
    compiled = compile_blocks(model) if config.train.compile else 0
    wall.mark("build")
    engine = initialize_engine(
        model,
        ds_config=ctx.job.ds_config,
        optimizer=config.optimizer,
        total_steps=config.train.steps,
        layout=ctx.layout,
        precision=config.precision.name,
    )
    wall.mark("engine")
    return engine, model_build, compiled


def resume(ctx: RunContext, engine: Any) -> Resumed:
    """Load the run's latest checkpoint when the run resumes (train.resume=auto, a requeue)."""
    config = ctx.config
    record = checkpoint_record.latest(ctx.run_dir) if resumes(config.train) else None
    if record is None:
        return Resumed()
    # Onto another layout: converted by the launching process (launchers/run.py).
    stage, precision = config.parallel.zero_stage, config.precision.name
    tag = resume_tag(record, layout=ctx.layout, zero_stage=stage, precision=precision)
    start_step = restore.load(engine, ctx.run_dir, tag=tag, rank=ctx.rank)
    # fp16: the loss scale goes on where it was, on any layout (DeepSpeed's is in files only
    # the same layout reads).
    window = config.precision.loss_scale_window
    fp16_loss_scale.restore_scaler(engine, record.get("fp16_loss_scale"), window=window)
    if ctx.lead:
        log.info("resumed from %s after %d completed steps", tag, start_step)
    return Resumed(start_step=start_step, record=record)


def build_steps(ctx: RunContext, parts: StepParts) -> Steps:
    """The step's implementation, chosen once: DeepSpeed's PipelineEngine schedules a pipeline's
    micro-batches itself; without one, the rank runs them."""
    return PipelineSteps(ctx, parts) if ctx.layout.pp > 1 else MicroBatchSteps(ctx, parts)


def _sinks(ctx: RunContext) -> list[MetricSink]:
    """Rank 0's metric sinks (runner/metrics/sinks.py); the other ranks log nothing."""
    if not ctx.lead:
        return []
    config, identity = ctx.config, ctx.identity
    return build_sinks(
        config.logger,
        run_dir=ctx.run_dir,
        total_steps=config.train.steps,
        name=identity.name,
        group=identity.group,
        config={**to_dict(config), "layout": ctx.layout.record(), "num_params": num_params(config.model)},
        run_id=identity.run_id,
    )


def _estimate(ctx: RunContext) -> Estimate:
    """The ledger's estimate of this rank's memory, by term (runner/metrics/ledger.py)."""
    config, layout = ctx.config, ctx.layout
    return deepspeed_estimate(
        model=config.model,
        parallel=config.parallel,
        precision=config.precision.name,
        optimizer=config.optimizer.name,
        batch=RankBatch(
            dp=layout.dp,
            micro_size=layout.micro_size,
            seq_len=config.data.seq_len,
            accum_steps=layout.accum_steps,
        ),
        host_is_device=ctx.device.type == "cpu",
        compiled=config.train.compile,
    )


def _step_parts(ctx: RunContext, engine: Any, resumed: Resumed, batches: BatchSource) -> StepParts:
    """The step's non-finite guard, phase clock and probes, beside its batches."""
    config, layout = ctx.config, ctx.layout
    nonfinite = NonFiniteGuard(
        config.train.on_nonfinite,
        max_skipped=config.train.max_skipped_steps,
        skipped=resumed.saved("skipped_steps") or [],
    )
    # The noise scale and exposed communication, read as the step runs (runner/metrics/step_probes.py).
    probes = StepProbes(engine, layout=layout, device=ctx.device, tied_embeddings=config.model.tie_embeddings)
    if resumed.saved("noise_scale"):
        probes.noise.restore(resumed.saved("noise_scale"))  # its EMAs go on where the checkpoint left them
    # Where each step's time goes (runner/metrics/phase_clock.py); a pipeline marks its instructions.
    clock = PhaseClock(ctx.device, PHASES if layout.pp == 1 else PIPELINE_PHASES)
    return StepParts(
        engine=engine,
        batches=batches,
        nonfinite=nonfinite,
        clock=clock,
        probes=probes,
        nan_steps=injected_nan_steps(ctx.rank),
    )


def _held_out(ctx: RunContext) -> BatchSource | None:
    """The held-out sequences of train.eval_every (None: no evaluation)."""
    config = ctx.config
    if config.train.eval_every <= 0:
        return None
    return BatchSource(
        config.data, config.model.vocab_size, config.seed, ctx.layout.global_size, held_out=True
    )


def set_up(ctx: RunContext, wall: WallClock, until_return: contextlib.ExitStack) -> Setup:
    """Build this rank's attempt; ``until_return`` holds what stays entered from the engine's
    construction until the attempt ends (16-bit matmuls in fp32 on a CPU)."""
    config, layout = ctx.config, ctx.layout
    engine, model_build, compiled = build_engine(ctx, wall)
    # From here on, not in the build: its ops need none of it (runner/hardware/cpu_half_matmul.py).
    until_return.enter_context(matmuls_for(ctx))
    resumed = resume(ctx, engine)
    wall.mark("resume")
    peak = resolve_peak(config.cluster, config.precision.name, accelerator=ctx.accelerator, ranks=layout.gpus)
    peak_flops = mean_over_ranks(torch.tensor([peak.flops], dtype=torch.float64, device=ctx.device))
    batches = BatchSource(config.data, config.model.vocab_size, config.seed, layout.global_size)
    held_out = _held_out(ctx)
    sinks = _sinks(ctx)
    if ctx.lead:
        log.info("peak FLOP/s per device: %.3g (%s)", peak_flops, peak.source)
    estimate = _estimate(ctx)
    # The step's peak is measured from here: what was built before counts in the host mark only.
    peak_memory = PeakMemory(ctx.device)
    host_high_water = host_peak_bytes()  # the build's included: a CPU reset below clears it
    peak_memory.reset()
    parts = _step_parts(ctx, engine, resumed, batches)
    steps = build_steps(ctx, parts)
    profiler = StepProfiler(config.train.profile_step, run_dir=ctx.run_dir, rank=ctx.rank, device=ctx.device)
    wall.mark("setup")
    return Setup(
        engine=engine,
        steps=steps,
        parts=parts,
        resumed=resumed,
        model_build=model_build,
        compiled_blocks=compiled,
        peak=peak,
        peak_flops=peak_flops,
        flops=flops_budget(config.model, seq_len=config.data.seq_len),
        held_out=held_out,
        overflows=fp16_loss_scale.OverflowLog(engine, resumed.saved("fp16_loss_scale")),
        estimate=estimate,
        peak_memory=peak_memory,
        host_high_water=host_high_water,
        profiler=profiler,
        sinks=sinks,
        # Every attempt in this run directory, for goodput across restarts (runner/metrics/goodput.py).
        attempt=goodput.AttemptLog(
            ctx.run_dir, started=wall.started, from_step=resumed.start_step, launcher=ctx.env.source
        )
        if ctx.lead
        else None,
        checkpoint_bytes=config_checkpoint_bytes(config),
        fault_step=injected_fault(ctx.rank),
    )
