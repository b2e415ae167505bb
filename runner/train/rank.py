"""One rank's life: join the group, build model, data and engine, train, leave cleanly.

Every rank runs this, whoever started it (the local launcher, torchrun, the deepspeed
launcher or srun). Rank 0 also owns the metric sinks and writes ``summary.json``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from runner.checkpoint import store as checkpoint
from runner.config import TrainConfig, to_dict
from runner.data.batches import BatchSource, rank_slice
from runner.diagnose import oom_killer, out_of_memory, peer_loss
from runner.diagnose.disk_room import no_room_words, out_of_room
from runner.engine.build import build_measured
from runner.engine.compile_blocks import compile_blocks, compile_summary
from runner.engine.distributed import init_distributed, select_accelerator, teardown
from runner.engine.fixes import fp16_stage0_loss_scale as fp16_loss_scale
from runner.engine.fixes import unfused_clip_norm as unfused_norm
from runner.engine.fixes.muon_compiles_at_import import import_muon_deferred
from runner.engine.fixes.stage0_step_at_construction import undo_prestep
from runner.engine.param_groups import param_groups
from runner.engine.schedule import lr_multiplier
from runner.environment import DistributedEnv
from runner.flops import flops_per_token, non_embedding_params, recompute_flops_per_token
from runner.hardware.cpu_half_matmul import computes_in_fp32, half_matmuls_in_fp32
from runner.hardware.mfu_peak import above_calibrated_peak, resolve_peak
from runner.hardware.peak_flops import torch_dtype
from runner.hardware.peak_memory import PeakMemory, host_peak_bytes
from runner.layout import Layout
from runner.metrics import goodput
from runner.metrics.ledger import (
    TERMS,
    Estimate,
    Ledger,
    deepspeed_estimate,
    fullest_device,
    host_relative_errors,
    measure_model_states,
    relative_errors,
    saved_activations,
)
from runner.metrics.phase_clock import PHASES, PIPELINE_PHASES, PhaseClock
from runner.metrics.sinks import MetricSink, build_sinks
from runner.metrics.step_probes import StepProbes
from runner.metrics.step_profiler import StepProfiler
from runner.metrics.throughput import FlopsBudget, throughput_metrics
from runner.metrics.wall_clock import WallClock, folder_bytes, wall_parts
from runner.model.transformer import num_params
from runner.parallel.pipeline import PipelineSteps
from runner.parallel.tensor import grad_norm as tp_grad_norm
from runner.plan.checkpoint_size import config_checkpoint_bytes
from runner.rundir.identity import RunIdentity
from runner.rundir.summary import read_summary, update_summary
from runner.train.evaluation import evaluation_summary, held_out_loss
from runner.train.nonfinite import NonFiniteGuard, engine_step, injected_nan_steps
from runner.train.preemption import REQUEUE, Preempted, StopSignals, restarts, resumes

log = logging.getLogger("ladder")


class _UntestedOptimizerWarning(logging.Filter):
    """Drops DeepSpeed's "You are using ZeRO with an untested optimizer, proceed with caution"
    (runtime/engine.py ``_do_optimizer_sanity_check``), which it logs for any optimizer beyond its
    Adam list: ladder allows SGD under ZeRO on purpose (runner/engine/deepspeed_config.py), and its
    losses under ZeRO are the plain run's (tests/multirank/test_layout_invariance.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "untested optimizer" not in record.getMessage()


def _quiet_deepspeed() -> None:
    """DeepSpeed logs at INFO on every rank; the runner reports what matters itself."""
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    ds_logger.addFilter(_UntestedOptimizerWarning())
    # DeepSpeed's ZeRO collectives call torch names that torch 2.13 deprecates; the warning is
    # DeepSpeed's to fix and, on every rank at every step, hides the run's own lines.
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
        category=FutureWarning,
    )


def _flops_budget(config: TrainConfig) -> FlopsBudget:
    """FLOPs per token under both conventions (N: the parameters that do matmul work)."""
    model = config.model
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
        seq_len=config.data.seq_len,
    )
    return FlopsBudget(
        per_token=flops_per_token(**common, causal=False),
        per_token_causal=flops_per_token(**common, causal=True),
        recompute_per_token=recompute_flops_per_token(
            **common, recompute=model.activation_checkpointing.value
        ),
    )


def _local_grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the gradients this rank holds (the full gradient when nothing is sharded)."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def _memory_metrics(estimate: Estimate, measured: Ledger | None) -> dict[str, float]:
    """``memory/est/<term>_gb`` always, ``memory/measured/<term>_gb`` once measured (GB = 1e9 B)."""
    metrics = {f"memory/est/{term}_gb": estimate.terms[term] / 1e9 for term in TERMS}
    if measured is not None:
        metrics.update({f"memory/measured/{term}_gb": measured.terms[term] / 1e9 for term in TERMS})
        metrics["memory/measured/residual_gb"] = sum(measured.residual.values()) / 1e9
    return metrics


def _memory_summary(
    estimate: Estimate, measured: Ledger | None, *, peak_bytes: float, measured_at: str
) -> dict[str, Any]:
    """The ledger as summary.json keeps it (GB = 1e9 bytes)."""

    def gb(values: dict[str, int]) -> dict[str, float]:
        return {f"{name}_gb": value / 1e9 for name, value in values.items()}

    summary: dict[str, Any] = {
        "unit": "GB (1e9 bytes)",
        "estimated": {
            **gb(estimate.terms),
            "total_gb": (sum(estimate.terms.values()) + sum(estimate.residual.values())) / 1e9,
            "residual": gb(estimate.residual),
        },
        "textbook": gb(estimate.textbook),
        "offloaded_to_host": gb(estimate.host),
        "measured_at": measured_at,
    }
    if measured is not None:
        summary["measured"] = {
            **gb(measured.terms),
            "peak_gb": peak_bytes / 1e9,
            "residual": gb(measured.residual),
        }
        summary["rel_error"] = relative_errors(estimate.terms, measured.terms)
        if estimate.host:
            summary["host_rel_error"] = host_relative_errors(estimate.host, measured.terms, measured.residual)
    return summary


def _injected_fault(rank: int) -> int | None:
    """The step at which ``LADDER_INJECT_FAULT=<rank>:<step>`` makes this rank raise (tests of failure)."""
    spec = os.environ.get("LADDER_INJECT_FAULT", "")
    if ":" not in spec:
        return None
    fault_rank, fault_step = spec.split(":", 1)
    return int(fault_step) if int(fault_rank) == rank else None


def _mean_over_ranks(value: torch.Tensor) -> float:
    import torch.distributed as dist

    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return float(value.item()) / dist.get_world_size()


def _peaks_over_ranks(device_peak: int, host_high_water: int, device: torch.device) -> dict[str, float]:
    """The device's peak and the process's host high-water mark (since it started), each the
    most over ranks, in GB; one all-reduce for both. ``host_high_water``: the mark before
    training, which a CPU device's peak reset clears from the kernel's (runner/hardware/peak_memory.py)."""
    import torch.distributed as dist

    host = max(host_high_water, host_peak_bytes())
    tensor = torch.tensor([float(device_peak), float(host)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return {"memory/peak_gb": float(tensor[0]) / 1e9, "memory/host_peak_gb": float(tensor[1]) / 1e9}


def _max_over_ranks(value: float, device: torch.device) -> float:
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


# torchrun and the deepspeed launcher send SIGKILL this long after their SIGTERM
# (torch.distributed.elastic's PContext.close, deepspeed/launcher/launch.py's wait_procs).
LAUNCHER_KILL_AFTER_S = 30.0


def slow_save_warning(save_s: float, *, source: str, warned: bool) -> None:
    """Once: a save that takes over half the grace torchrun gives ranks after its SIGTERM."""
    if source == "torchrun" and not warned and save_s > LAUNCHER_KILL_AFTER_S / 2:
        log.warning(
            "a checkpoint took %.0f s; torchrun (or the deepspeed launcher) kills its ranks %.0f s after "
            "its SIGTERM, so a save at a stop may be cut off (the one before stays the latest); ladder's "
            "own launcher (python train.py gpus=N) waits for it",
            save_s,
            LAUNCHER_KILL_AFTER_S,
        )


def _stopped(completed: int, asked: int, stop: StopSignals, *, rank: int, source: str) -> Preempted:
    """What every rank raises once the ranks agreed to stop and saved ``completed`` steps.

    The signal is named as this rank received it (Ctrl-C's SIGINT, the launcher's SIGTERM),
    or by what the ranks agreed on where this rank received none.
    """
    name = stop.name if stop.asked == asked else ("SIGUSR2" if asked == REQUEUE else "SIGTERM")
    requeued: bool | None = None
    outcome = (
        "SLURM requeues or ends the job itself"
        if source == "slurm"
        else "train.resume=auto in this run directory continues it"
    )
    if asked == REQUEUE and source == "slurm":
        requeued, outcome = stop.hand_back() if rank == 0 else (None, "rank 0 hands the job back")
    tag = checkpoint.tag_for(completed)
    return Preempted(
        {
            "signal": name,
            "completed_steps": completed,
            "checkpoint": tag,
            "requeued": requeued,
            "slurm_restart": restarts(os.environ),
            "reason": f"stopped by {name} after {completed} steps with checkpoint {tag}; {outcome}",
        }
    )


def _train(
    config: TrainConfig,
    *,
    layout: Layout,
    ds_config: dict[str, Any],
    run_dir: Path,
    env: DistributedEnv,
    identity: RunIdentity,
    device: torch.device,
    accelerator: str,
    process_group_s: float = 0.0,
    until_return: contextlib.ExitStack,
    stop: StopSignals | None = None,
) -> dict[str, Any]:
    """Build, train and record this rank's attempt; ``until_return`` holds what stays entered
    from the engine's construction until the attempt ends (16-bit matmuls in fp32 on a CPU)."""
    import deepspeed

    # Where this attempt's wall time goes (runner/metrics/wall_clock.py).
    wall = WallClock(process_group_s=process_group_s)
    wall.mark("launch")
    _quiet_deepspeed()
    # DeepSpeed imports it whatever the optimizer (runner/engine/fixes/muon_compiles_at_import.py)
    import_muon_deferred()
    torch.manual_seed(config.seed)
    model, model_build = build_measured(config, layout=layout, ds_config=ds_config, device=device)
    compiled_blocks = compile_blocks(model) if config.train.compile else 0
    wall.mark("build")
    opt = config.optimizer
    schedule = dict(
        warmup_steps=opt.warmup_steps,
        total_steps=config.train.steps,
        schedule=opt.schedule,
        min_lr_ratio=opt.min_lr_ratio,
    )

    def lr_lambda(step: int) -> float:
        return lr_multiplier(step, **schedule)  # type: ignore[arg-type]

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, opt.weight_decay),
        config=ds_config,
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda),
    )
    undo_prestep(engine.optimizer)  # stage 0 in 16 bits: DeepSpeed's step at construction
    unfused_norm.install(engine, tp=layout.tp, pp=layout.pp)  # stage 0 in 16 bits: the whole model's norm
    fp16_loss_scale.install(engine)  # fp16 at stage 0: the loss scaled before backward
    fp16_loss_scale.grow_after_step(engine)  # fp16: a step's gradients unscaled by the scale they had
    wall.mark("engine")
    # From here on, not in the build: its ops need none of it (runner/hardware/cpu_half_matmul.py).
    until_return.enter_context(_matmuls(config, device=device, rank=env.rank))
    start_step = 0
    record = checkpoint.latest(run_dir) if resumes(config) else None
    if record is not None:
        # Onto another layout: converted by the launching process (launchers/run.py).
        stage, precision = config.parallel.zero_stage, config.precision.name
        tag = checkpoint.resume_tag(record, layout=layout, zero_stage=stage, precision=precision)
        start_step = checkpoint.load(engine, run_dir, tag=tag, rank=env.rank)
        # fp16: the loss scale goes on where it was, on any layout (DeepSpeed's is in files only
        # the same layout reads).
        window = config.precision.loss_scale_window
        fp16_loss_scale.restore_scaler(engine, record.get("fp16_loss_scale"), window=window)
        if env.rank == 0:
            log.info("resumed from %s after %d completed steps", tag, start_step)
    wall.mark("resume")
    peak = resolve_peak(config.cluster, config.precision.name, accelerator=accelerator)
    peak_flops = _mean_over_ranks(torch.tensor([peak.flops], dtype=torch.float64, device=device))
    flops = _flops_budget(config)
    batches = BatchSource(config.data, config.model.vocab_size, config.seed, layout.global_size)
    eval_every = config.train.eval_every
    held_out = (
        BatchSource(config.data, config.model.vocab_size, config.seed, layout.global_size, held_out=True)
        if eval_every > 0
        else None
    )
    dp_rank = env.rank // (layout.tp * layout.pp)
    nan_steps = injected_nan_steps(env.rank)
    nonfinite = NonFiniteGuard(
        config.train.on_nonfinite,
        max_skipped=config.train.max_skipped_steps,
        skipped=[] if record is None else record.get("skipped_steps", []),
    )
    # With a pipeline, DeepSpeed's PipelineEngine runs each step's micro-batches itself.
    pipe = (
        PipelineSteps(
            engine,
            batches,
            layout=layout,
            precision=config.precision.name,
            grad_clip=config.optimizer.grad_clip,
            nonfinite=nonfinite,
            nan_steps=nan_steps,
        )
        if layout.pp > 1
        else None
    )
    tokens_per_step = layout.global_size * config.data.seq_len
    n_params = num_params(config.model)

    sinks: list[MetricSink] = []
    if env.rank == 0:
        sinks = build_sinks(
            config.logger,
            run_dir=run_dir,
            total_steps=config.train.steps,
            name=identity.name,
            group=identity.group,
            config={**to_dict(config), "layout": layout.record(), "num_params": n_params},
            run_id=identity.run_id,
        )
        log.info("peak FLOP/s per device: %.3g (%s)", peak_flops, peak.source)

    estimate = deepspeed_estimate(
        model=config.model,
        num_params=n_params,
        parallel=config.parallel,
        precision=config.precision.name,
        optimizer=config.optimizer.name,
        dp=layout.dp,
        micro_size=layout.micro_size,
        seq_len=config.data.seq_len,
        host_is_device=device.type == "cpu",
        accum_steps=layout.accum_steps,
        compiled=config.train.compile,
    )
    # Model states are measured at the accumulation boundary of the first step after one that
    # updated the weights, when the optimizer state exists (the second step, unless fp16's
    # loss scaler or train.on_nonfinite=skip skipped the first), or of the last step;
    # activations over the first micro-batch of the first step.
    ledger_step: int | None = None
    updated = False  # some step of this run applied its update
    ledger: Ledger | None = None
    saved_bytes = 0

    peak_memory = PeakMemory(device)
    host_high_water = host_peak_bytes()  # the build's included: a CPU reset below clears it
    peak_memory.reset()
    last: dict[str, float] = {}
    step = 0
    grad_norm: float | None = None
    # DeepSpeed reports no global grad norm at stage 0 in fp32; there every rank holds the
    # full all-reduced gradient at the boundary, so the norm is computed from it directly.
    own_grad_norm = config.parallel.zero_stage == 0 and "bf16" not in ds_config and "fp16" not in ds_config
    own_grad_norm = own_grad_norm and pipe is None  # a stage holds its own layers' gradients only
    # The noise scale and exposed communication, read as the step runs (runner/metrics/step_probes.py).
    probes = StepProbes(engine, layout=layout, device=device, tied_embeddings=config.model.tie_embeddings)
    if record is not None and record.get("noise_scale"):
        probes.noise.restore(record["noise_scale"])  # its EMAs go on where the checkpoint left them
    overflows = fp16_loss_scale.OverflowLog(engine, record.get("fp16_loss_scale") if record else None)
    # Where each step's time goes (runner/metrics/phase_clock.py); a pipeline marks its instructions.
    clock = PhaseClock(device, PHASES if pipe is None else PIPELINE_PHASES)
    if pipe is not None:
        pipe.time_phases(clock)
        pipe.after_each_backward(lambda: probes.micro_batch_done(engine))
    fault_step = _injected_fault(env.rank)
    profiler = StepProfiler(config.train.profile_step, run_dir=run_dir, rank=env.rank, device=device)
    every = config.train.checkpoint_every
    checkpoint_bytes = config_checkpoint_bytes(config)
    status: dict[str, Any] = {"status": "failed", "error": "interrupted"}
    wall.mark("setup")
    interruption: dict[str, Any] | None = None
    evaluated: dict[str, Any] | None = None  # the latest held-out evaluation of this attempt
    step = start_step
    # Every attempt in this run directory, for goodput across restarts (runner/metrics/goodput.py).
    attempt = (
        goodput.AttemptLog(run_dir, started=wall.started, from_step=start_step, launcher=env.source)
        if env.rank == 0
        else None
    )
    try:
        for step in range(start_step, config.train.steps):
            if step == fault_step:
                raise RuntimeError(f"fault injected by LADDER_INJECT_FAULT on rank {env.rank} at step {step}")
            lr = engine.get_lr()[0]
            probes.step_started()
            loss_scale = fp16_loss_scale.current_scale(engine)  # what this step's backward multiplies by
            profiler.step_started(step)
            started = time.perf_counter()
            clock.start()
            loss_sum = torch.zeros((), dtype=torch.float32, device=device)
            skip = False  # train.on_nonfinite=skip: this step's update is dropped (runner/train/nonfinite.py)
            if ledger_step is None and (updated or step == config.train.steps - 1):
                ledger_step = step
            if pipe is not None:
                # Pipeline parallel (runner/parallel/pipeline.py): forward, backward and the optimizer
                # step of all micro-batches, 1F1B; the micro-batch loop below runs no iteration.
                # A non-finite loss is caught before the optimizer step, as below.
                loss_value, skip = pipe.train_step(
                    step, measure_states=step == ledger_step, measure_activations=step == start_step
                )
                if step == ledger_step:
                    ledger = pipe.ledger()
            for micro in range(layout.accum_steps if pipe is None else 0):
                start = rank_slice(dp_rank, micro, layout.micro_size, layout.accum_steps)
                inputs, targets = batches.micro_batch(step, start, layout.micro_size)
                inputs, targets = inputs.to(device), targets.to(device)
                clock.mark("data")
                if step == start_step and micro == 0:
                    with saved_activations(engine.module) as saved:
                        loss = engine.module.loss_function(engine(inputs), shift_labels=targets)
                    saved_bytes = saved["activations"]
                else:
                    loss = engine.module.loss_function(engine(inputs), shift_labels=targets)
                if step in nan_steps:
                    loss = loss * float("nan")  # LADDER_INJECT_NAN (tests of train.on_nonfinite)
                clock.mark("forward")
                engine.backward(loss)
                clock.mark("backward")
                loss_sum += loss.detach().float()
                boundary = micro == layout.accum_steps - 1
                probes.micro_batch_done(engine)
                clock.mark("other")
                if boundary:
                    # Checked before the optimizer step: a non-finite loss never reaches the
                    # weights; it stops the run or skips the update, the same on every rank.
                    loss_value = _mean_over_ranks(loss_sum / layout.accum_steps)
                    skip = nonfinite.should_skip(loss_value, step=step)
                    if own_grad_norm:
                        grad_norm = (
                            _local_grad_norm(engine.module)
                            if layout.tp == 1
                            else tp_grad_norm(engine.module, tp=layout.tp)  # shards summed over tp
                        )
                    if step == ledger_step:
                        ledger = measure_model_states(engine, precision=config.precision.name)
                        ledger.terms["activations"] = saved_bytes
                        ledger = fullest_device(ledger)
                # DeepSpeed steps the optimizer at the accumulation boundary only
                engine_step(engine, skip=skip)
                clock.mark("optimizer")
            clock.mark("other")
            if device.type == "cuda":
                # The optimizer's kernels are still queued (bf16 ZeRO syncs nowhere in its step):
                # they are this step's time. The metrics below would wait for them anyway.
                torch.cuda.synchronize(device)
            step_s = time.perf_counter() - started
            wall.step(step_s)
            profiler.step_done(step)
            if not own_grad_norm:
                grad_norm = engine.get_global_grad_norm()
            measured = probes.step_done(grad_norm=grad_norm, skipped=skip)
            overflows.step_done(step, grad_norm=grad_norm, skipped=skip)
            # An fp16 overflow's step (its norm inf) is skipped by DeepSpeed's loss scaler.
            updated = updated or not (skip or (grad_norm is not None and not math.isfinite(grad_norm)))
            metrics = {
                "loss": loss_value,
                "lr": lr,
                "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                **measured,
                **clock.seconds(),
                "train/skipped_steps": len(nonfinite.skipped),
                **({"train/loss_scale": loss_scale} if loss_scale is not None else {}),
                **throughput_metrics(
                    step_s=step_s,
                    tokens_per_step=tokens_per_step,
                    n_devices=layout.gpus,
                    flops=flops,
                    peak_flops=peak_flops,
                ),
                **_peaks_over_ranks(peak_memory.read(), host_high_water, device),
                **_memory_metrics(estimate, ledger),
            }
            if held_out is not None and ((step + 1) % eval_every == 0 or step + 1 == config.train.steps):
                evaluating = time.perf_counter()
                metrics["eval/loss"] = (
                    pipe.eval_loss(held_out, batches=config.train.eval_batches)
                    if pipe is not None
                    else held_out_loss(
                        engine,
                        held_out,
                        batches=config.train.eval_batches,
                        layout=layout,
                        dp_rank=dp_rank,
                        device=device,
                    )
                )
                wall.evaluation(time.perf_counter() - evaluating)
                evaluated = {"loss": metrics["eval/loss"], "step": step + 1}
            last = metrics
            logged = step % config.logger.log_every == 0 or step == config.train.steps - 1
            if logged:
                for sink in sinks:
                    sink.log(step, metrics)
            # Under SLURM and the local launcher the ranks agree, after every step but the last,
            # whether a signal asks them to stop (runner/train/preemption.py): then they save here and leave.
            last_step = step + 1 == config.train.steps
            asked = 0 if stop is None or last_step else int(_max_over_ranks(stop.asked, device))
            saving_now = bool((every and (step + 1) % every == 0) or asked)
            if saving_now:
                saving = time.perf_counter()
                checkpoint.save(
                    engine,
                    run_dir,
                    completed_steps=step + 1,
                    layout=layout,
                    zero_stage=config.parallel.zero_stage,
                    rank=env.rank,
                    keep=config.train.keep_checkpoints,
                    skipped_steps=nonfinite.skipped,
                    noise_scale=probes.noise.state(),
                    loss_scale=overflows.state(),
                    expected_bytes=checkpoint_bytes,
                )
                written = run_dir / checkpoint.CHECKPOINT_DIR / checkpoint.tag_for(step + 1)
                wall.checkpoint(time.perf_counter() - saving, folder_bytes(written) if env.rank == 0 else 0)
                if env.rank == 0:
                    log.info("%s", wall.last_save(checkpoint.tag_for(step + 1)))
                    slow_save_warning(wall.last_save_s, source=env.source, warned=wall.checkpoints > 1)
            if attempt is not None:
                attempt.progress(
                    step + 1, wall.steps_s, saved=saving_now, logged=logged, parts=lambda: wall_parts(wall)
                )
            if asked and stop is not None:
                raise _stopped(step + 1, asked, stop, rank=env.rank, source=env.source)
        status = {"status": "completed", "error": None}
        mfu = last.get("throughput/mfu")
        if env.rank == 0 and (overrun := above_calibrated_peak(peak, mfu, config.precision.name)):
            log.warning("%s", overrun)
    except Preempted as stopped:
        status = {"status": "interrupted", "error": stopped.record["reason"]}
        interruption = stopped.record
        raise
    except BaseException as error:
        words = no_room_words(error, run_dir) if out_of_room(error) else f"{type(error).__name__}: {error}"
        status = {"status": "failed", "error": words}
        raise
    finally:
        summary: dict[str, Any] = {}
        if status["status"] == "failed" and read_summary(run_dir).get("status") == "failed":
            status = {}  # another rank failed first and recorded why: keep its cause
        if env.rank == 0:
            with _recorded_unless_out_of_room(status, run_dir):
                if interruption is not None:  # each stop at a signal, across requeues
                    earlier = read_summary(run_dir).get("interruptions") or []
                    status["interruptions"] = [*earlier, interruption]
                completed = (step + 1) if status.get("status") in ("completed", "interrupted") else step
                wall_time = wall.summary()
                ended = status.get("status") or "failed"  # {}: another rank failed first
                if attempt is not None:
                    parts = wall_parts(wall, wall_time)
                    attempt.end(status=ended, steps_completed=completed, steps_s=wall.steps_s, parts=parts)
                summary = update_summary(
                    run_dir,
                    **status,
                    steps_completed=completed,
                    final=last,
                    peak_flops_per_device=peak_flops,
                    peak_flops_source=peak.source,
                    peak_memory_measure=peak_memory.label,
                    cuda_allocator=peak_memory.allocator_record(),
                    host_memory={
                        **(read_summary(run_dir).get("host_memory") or {}),
                        "measured_per_rank_gb": last.get("memory/host_peak_gb"),
                        "measured": "the process's high-water RSS since it started, the most over ranks",
                    },
                    memory=_memory_summary(
                        estimate,
                        ledger,
                        peak_bytes=last.get("memory/peak_gb", 0.0) * 1e9,
                        measured_at=f"each term at its most over ranks, step {ledger_step} accumulation "
                        "boundary (before the optimizer step)",
                    ),
                    accelerator=accelerator,
                    model_build={"rank": 0, **model_build},
                    compile=compile_summary(compiled_blocks) if compiled_blocks else None,
                    **probes.summary(seq_len=config.data.seq_len),
                    pipeline=pipe.summary(step_s=last.get("time/step_s"), p2p_s=last.get("time/p2p_s"))
                    if pipe is not None
                    else None,
                    skipped_steps=nonfinite.summary(),
                    fp16_loss_scale=overflows.summary(),
                    resumed_from_step=start_step or None,
                    profile=profiler.summary(run_dir),
                    wall_time=wall_time,
                    eval=evaluation_summary(config, evaluated, layout.global_size)
                    if held_out is not None
                    else None,
                    goodput=goodput.account(run_dir),
                )
        for sink in sinks:
            sink.close(summary)
    return summary


@contextlib.contextmanager
def _recorded_unless_out_of_room(status: dict[str, Any], run_dir: Path) -> Iterator[None]:
    """Rank 0's records of a run that failed for want of room may fail the same way: then the
    failure is said on stderr, and the error that ended the run is the one raised."""
    try:
        yield
    except OSError as error:
        if status.get("status") != "failed" or not out_of_room(error):
            raise
        log.error("the run's end could not be recorded in summary.json: %s", no_room_words(error, run_dir))


@contextlib.contextmanager
def _matmuls(config: TrainConfig, *, device: torch.device, rank: int) -> Iterator[None]:
    """16-bit matmuls in fp32 on a CPU whose torch has no 16-bit GEMM kernels for it
    (runner/hardware/cpu_half_matmul.py); rank 0 says so. A compiled run keeps torch's own kernels."""
    dtype = torch_dtype(config.precision.name)
    if not computes_in_fp32(dtype, device_type=device.type):
        yield
        return
    name = config.precision.name.value
    if config.train.compile:
        if rank == 0:
            log.warning(
                "%s matmuls on this CPU run on torch's reference kernel (it has no %s GEMM kernels for "
                "this CPU), many times slower than fp32; train.compile=true keeps them there, since "
                "torch.compile does not trace under the fp32 matmuls uncompiled runs get",
                name,
                name,
            )
        yield
        return
    if rank == 0:
        log.info(
            "%s matmuls computed in fp32 and rounded to %s: torch has no %s GEMM kernels for this CPU",
            name,
            name,
            name,
        )
    with half_matmuls_in_fp32(dtype, device_type=device.type):
        yield


def run_rank(
    config: TrainConfig,
    *,
    layout: Layout,
    ds_config: dict[str, Any],
    run_dir: Path,
    env: DistributedEnv,
    identity: RunIdentity,
) -> dict[str, Any]:
    """Train on this rank and return rank 0's summary (empty on other ranks)."""
    # A SLURM task stops at SIGUSR2 / SIGTERM after a checkpoint (runner/train/preemption.py), and so
    # does a rank of the local launcher at SIGINT (Ctrl-C) or SIGTERM (the launcher's, passed on).
    stop = StopSignals()
    watching = env.source in ("slurm", "local", "torchrun") and stop.install()
    oom_counts = oom_killer.read_counts()  # the kernel's, as this rank starts (runner/diagnose/peer_loss.py)
    accelerator = select_accelerator()
    device, process_group_s = init_distributed(env, accelerator=accelerator)
    ok = False
    try:
        with contextlib.ExitStack() as until_return:
            summary = _train(
                config,
                layout=layout,
                ds_config=ds_config,
                run_dir=run_dir,
                env=env,
                identity=identity,
                device=device,
                accelerator=accelerator,
                process_group_s=process_group_s,
                stop=stop if watching else None,
                until_return=until_return,
            )
        ok = True
        return summary
    except Preempted:
        ok = True  # every rank saved and stopped after the same step: leave together
        raise
    except BaseException as error:
        out_of_memory.explain(error, config, run_dir)  # where it ran out, and the plan's terms
        peer_loss.explain(error, oom_counts)  # another rank's process ended first
        raise
    finally:
        teardown(ok=ok)
        stop.restore()
