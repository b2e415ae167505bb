"""One rank's life: join the group, build model, data and engine, train, leave cleanly.

Every rank runs this, whoever started it (the local launcher, torchrun, the deepspeed
launcher or srun). Rank 0 also owns the metric sinks and writes ``summary.json``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from launchers.environment import DistributedEnv
from runner.config import TrainConfig, to_dict
from runner.data import BatchSource, rank_slice
from runner.distributed import init_distributed, select_accelerator, teardown
from runner.flops import flops_per_token, non_embedding_params, recompute_flops_per_token
from runner.identity import RunIdentity
from runner.layout import Layout
from runner.ledger import (
    TERMS,
    Estimate,
    Ledger,
    deepspeed_estimate,
    measure_model_states,
    relative_errors,
    saved_activations,
)
from runner.model import build_model, lm_loss, num_params
from runner.peak import resolve_peak
from runner.peak_memory import PeakMemory
from runner.schedule import lr_multiplier
from runner.sinks import MetricSink, build_sinks
from runner.summary import update_summary
from runner.throughput import FlopsBudget, throughput_metrics

log = logging.getLogger("ladder")


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices and embeddings, not norm gains (nanoGPT's rule: decay params with dim >= 2)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _quiet_deepspeed() -> None:
    """DeepSpeed logs at INFO on every rank; the runner reports what matters itself."""
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)


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
        "measured_at": measured_at,
    }
    if measured is not None:
        summary["measured"] = {
            **gb(measured.terms),
            "peak_gb": peak_bytes / 1e9,
            "residual": gb(measured.residual),
        }
        summary["rel_error"] = relative_errors(estimate.terms, measured.terms)
    return summary


def _mean_over_ranks(value: torch.Tensor) -> float:
    import torch.distributed as dist

    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return float(value.item()) / dist.get_world_size()


def _max_over_ranks(value: float, device: torch.device) -> float:
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


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
) -> dict[str, Any]:
    import deepspeed

    _quiet_deepspeed()
    torch.manual_seed(config.seed)
    model = build_model(config.model)
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
        model_parameters=_param_groups(model, opt.weight_decay),
        config=ds_config,
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda),
    )
    peak = resolve_peak(config.cluster, config.precision.name, accelerator=accelerator)
    peak_flops = _mean_over_ranks(torch.tensor([peak.flops], dtype=torch.float64, device=device))
    flops = _flops_budget(config)
    batches = BatchSource(config.data, config.model.vocab_size, config.seed, layout.global_size)
    dp_rank = env.rank // (layout.tp * layout.pp)
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
    )
    # Model states are measured at the accumulation boundary of the second step, when the
    # optimizer state exists; activations over the first micro-batch of the first step.
    ledger_step = min(1, config.train.steps - 1)
    ledger: Ledger | None = None
    saved_bytes = 0

    peak_memory = PeakMemory(device)
    peak_memory.reset()
    last: dict[str, float] = {}
    step = 0
    grad_norm: float | None = None
    # DeepSpeed reports no global grad norm at stage 0 in fp32; there every rank holds the
    # full all-reduced gradient at the boundary, so the norm is computed from it directly.
    own_grad_norm = config.parallel.zero_stage == 0 and "bf16" not in ds_config and "fp16" not in ds_config
    status: dict[str, Any] = {"status": "failed", "error": "interrupted"}
    try:
        for step in range(config.train.steps):
            lr = engine.get_lr()[0]
            started = time.perf_counter()
            loss_sum = torch.zeros((), dtype=torch.float32, device=device)
            for micro in range(layout.accum_steps):
                start = rank_slice(dp_rank, micro, layout.micro_size, layout.accum_steps)
                inputs, targets = batches.micro_batch(step, start, layout.micro_size)
                inputs, targets = inputs.to(device), targets.to(device)
                if step == 0 and micro == 0:
                    with saved_activations(engine.module) as saved:
                        loss = lm_loss(engine(inputs), targets)
                    saved_bytes = saved["activations"]
                else:
                    loss = lm_loss(engine(inputs), targets)
                engine.backward(loss)
                boundary = micro == layout.accum_steps - 1
                if own_grad_norm and boundary:
                    grad_norm = _local_grad_norm(engine.module)
                if step == ledger_step and boundary:
                    ledger = measure_model_states(engine, precision=config.precision.name)
                    ledger.terms["activations"] = saved_bytes
                engine.step()  # DeepSpeed steps the optimizer at the accumulation boundary only
                loss_sum += loss.detach().float()
            loss_value = _mean_over_ranks(loss_sum / layout.accum_steps)
            step_s = time.perf_counter() - started
            if not torch.isfinite(torch.tensor(loss_value)):
                raise FloatingPointError(
                    f"loss is {loss_value} at step {step}: training diverged; lower optimizer.lr, "
                    f"raise optimizer.warmup_steps, or use precision=fp32/bf16"
                )
            if not own_grad_norm:
                grad_norm = engine.get_global_grad_norm()
            metrics = {
                "loss": loss_value,
                "lr": lr,
                "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                **throughput_metrics(
                    step_s=step_s,
                    tokens_per_step=tokens_per_step,
                    n_devices=layout.gpus,
                    flops=flops,
                    peak_flops=peak_flops,
                ),
                "memory/peak_gb": _max_over_ranks(peak_memory.read(), device) / 1e9,
                **_memory_metrics(estimate, ledger),
            }
            last = metrics
            if step % config.logger.log_every == 0 or step == config.train.steps - 1:
                for sink in sinks:
                    sink.log(step, metrics)
        status = {"status": "completed", "error": None}
    except BaseException as error:
        status = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
        raise
    finally:
        summary: dict[str, Any] = {}
        if env.rank == 0:
            summary = update_summary(
                run_dir,
                **status,
                steps_completed=(step + 1) if status["status"] == "completed" else step,
                final=last,
                peak_flops_per_device=peak_flops,
                peak_flops_source=peak.source,
                peak_memory_measure=peak_memory.label,
                memory=_memory_summary(
                    estimate,
                    ledger,
                    peak_bytes=last.get("memory/peak_gb", 0.0) * 1e9,
                    measured_at=f"rank 0, step {ledger_step} accumulation boundary (before optimizer step)",
                ),
                accelerator=accelerator,
            )
        for sink in sinks:
            sink.close(summary)
    return summary


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
    accelerator = select_accelerator()
    device = init_distributed(env, accelerator=accelerator)
    try:
        return _train(
            config,
            layout=layout,
            ds_config=ds_config,
            run_dir=run_dir,
            env=env,
            identity=identity,
            device=device,
            accelerator=accelerator,
        )
    finally:
        teardown()
