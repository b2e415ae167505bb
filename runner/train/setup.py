"""What one rank builds before its first step: model, engine, resume, sinks, the memory estimate,
and the step hooks a run adds.

Each part is built by its own small function below; the trainer (runner/train/trainer.py
``Trainer.__init__``) calls them in the order the rank needs them and holds what they return.
"""

from __future__ import annotations

import contextlib
import logging
import runpy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runner.checkpoint import restore
from runner.checkpoint.resume_rules import resume_tag
from runner.config import ModelConfig, to_dict
from runner.data.batches import BatchSource
from runner.engine.build import build_measured
from runner.engine.compile_blocks import compile_blocks
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.engine.fixes import fp16_stage0_loss_scale as fp16_loss_scale
from runner.engine.initialize import before_build, initialize_engine
from runner.flops import flops_per_token, non_embedding_params, recompute_flops_per_token
from runner.hardware.cpu_half_matmul import computes_in_fp32, half_matmuls_in_fp32
from runner.metrics.ledger import Estimate, RankBatch, deepspeed_estimate
from runner.metrics.sinks import MetricSink, build_sinks
from runner.metrics.throughput import FlopsBudget
from runner.metrics.wall_clock import WallClock
from runner.model.shape import n_kv_head
from runner.model.transformer import num_params
from runner.parallel.sequence import sequence_groups, split_sequence
from runner.rundir import checkpoint_record
from runner.rundir.summary_records import ModelBuild
from runner.train.context import RunContext
from runner.train.preemption import resumes
from runner.train.step_hooks import StepHooks

log = logging.getLogger("ladder")

# Step hooks a run adds to ladder's own (runner/train/step_hooks.py): ``<file.py>:<name>``, a
# Python file and the callable in it that returns a rank's hooks. The tests inject faults so
# (tests/step_faults.py); ladder itself sets it nowhere.
STEP_HOOKS_ENV = "LADDER_STEP_HOOKS"


@dataclass(frozen=True)
class Resumed:
    """Where this attempt starts: the completed steps, and the checkpoint's record (None: from scratch)."""

    start_step: int = 0
    record: checkpoint_record.CheckpointRecord | None = None

    def saved(self, key: str) -> Any:
        """A field the checkpoint's record keeps (None from scratch or where it has none)."""
        return None if self.record is None else self.record.get(key)


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
            **common,
            recompute=model.activation_checkpointing.value,
            kv_width=model.d_model * n_kv_head(model) // model.n_head,
            ffn_hidden=model.ffn_hidden,
        ),
    )


@contextlib.contextmanager
def matmuls_for(ctx: RunContext) -> Iterator[None]:
    """16-bit matmuls in fp32 on a CPU whose torch has no 16-bit GEMM kernels for it
    (runner/hardware/cpu_half_matmul.py); rank 0 says so. A compiled run keeps torch's own kernels."""
    config, device = ctx.config, ctx.device
    dtype = config.precision.name.torch_dtype
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


def build_engine(ctx: RunContext, wall: WallClock) -> tuple[DeepSpeedEngine, ModelBuild, int]:
    """The model built for the layout (compiled blocks with train.compile), then DeepSpeed's engine
    with its faults fixed; the build's record and the blocks compiled."""
    config = ctx.config
    before_build()
    torch.manual_seed(config.seed)
    # DeepSpeed-Ulysses' groups (a collective on every rank), before a ZeRO-3 build counts by them.
    groups = sequence_groups(ctx.layout.sp) if ctx.layout.sp > 1 else None
    model, model_build = build_measured(
        config, layout=ctx.layout, ds_config=ctx.job.ds_config, device=ctx.device, mpu=groups
    )
    if (read := model_build["init_from"]) is not None and ctx.lead:
        log.info(
            "model.init_from: %d tensors, %.3f GB, read from %s",
            read["tensors"],
            read["bytes"] / 1e9,
            read["path"],
        )
    compiled = compile_blocks(model) if config.train.compile else 0
    if groups is not None:  # DeepSpeed-Ulysses: this rank's piece of each sample
        split_sequence(model, groups)
    wall.mark("build")
    engine = initialize_engine(
        model,
        ds_config=ctx.job.ds_config,
        optimizer=config.optimizer,
        total_steps=config.train.steps,
        layout=ctx.layout,
        precision=config.precision.name,
        mpu=groups,
    )
    wall.mark("engine")
    return engine, model_build, compiled


def resume(ctx: RunContext, engine: DeepSpeedEngine) -> Resumed:
    """Load the run's latest checkpoint when the run resumes (train.resume=auto, a requeue)."""
    config = ctx.config
    record = checkpoint_record.latest(ctx.run_dir) if resumes(config.train) else None
    if record is None:
        return Resumed()
    # Onto another layout: converted by the launching process (launchers/run.py).
    zero_stage, precision = config.parallel.zero_stage, config.precision.name
    tag = resume_tag(record, layout=ctx.layout, zero_stage=zero_stage, precision=precision)
    start_step = restore.load(engine, ctx.run_dir, tag=tag, rank=ctx.rank)
    # fp16: the loss scale goes on where it was, on any layout (DeepSpeed's is in files only
    # the same layout reads).
    window = config.precision.loss_scale_window
    fp16_loss_scale.restore_scaler(engine, record.get("fp16_loss_scale"), window=window)
    if ctx.lead:
        log.info("resumed from %s after %d completed steps", tag, start_step)
    return Resumed(start_step=start_step, record=record)


def sinks_for(ctx: RunContext) -> list[MetricSink]:
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
        config={**to_dict(config), "layout": ctx.layout.to_json(), "num_params": num_params(config.model)},
        run_id=identity.run_id,
    )


def memory_estimate(ctx: RunContext) -> Estimate:
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


def held_out_batches(ctx: RunContext) -> BatchSource | None:
    """The held-out sequences of train.eval_every (None: no evaluation)."""
    config = ctx.config
    if config.train.eval_every <= 0:
        return None
    return BatchSource(
        config.data, config.model.vocab_size, config.seed, ctx.layout.global_size, held_out=True
    )


def extra_step_hooks(rank: int, environ: Mapping[str, str]) -> list[StepHooks]:
    """The hooks ``LADDER_STEP_HOOKS=<file.py>:<name>`` adds to this rank's steps: what ``<name>(rank=rank)``
    returns, from that file run once as a module; none where the variable is unset."""
    spec = environ.get(STEP_HOOKS_ENV, "")
    if not spec:
        return []
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise ValueError(
            f"{STEP_HOOKS_ENV}={spec}: expected <file.py>:<name>, e.g. /repo/tests/step_faults.py:hooks"
        )
    if not Path(path).is_file():
        raise FileNotFoundError(f"{STEP_HOOKS_ENV}={spec}: no file {path} (from {Path.cwd()})")
    found = runpy.run_path(path)
    if not callable(found.get(name)):
        raise ValueError(f"{STEP_HOOKS_ENV}={spec}: {path} defines no callable {name}")
    hooks: StepHooks = found[name](rank=rank)
    return [hooks]
