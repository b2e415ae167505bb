"""Per-step throughput metrics: tokens/s, TFLOP/s per device, MFU (PaLM and causal), HFU."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlopsBudget:
    """Model FLOPs per token under both conventions, and what recomputation adds."""

    per_token: float  # 6N + 12*L*h*s (PaLM, Chowdhery et al. 2022, appendix B)
    per_token_causal: float  # attention term halved for the causal mask (Megatron-LM)
    recompute_per_token: float = 0.0  # forward work redone by activation checkpointing


def throughput_metrics(
    *, step_s: float, tokens_per_step: int, n_devices: int, flops: FlopsBudget, peak_flops: float
) -> dict[str, float]:
    """Metrics of one optimizer step that took ``step_s`` seconds over ``n_devices`` ranks."""
    tokens_per_s = tokens_per_step / step_s
    per_device = tokens_per_s / n_devices
    # MFU = achieved model FLOP/s / (peak FLOP/s x devices) (PaLM appendix B).
    metrics = {
        "throughput/tokens_per_s": tokens_per_s,
        "throughput/tokens_per_s_per_device": per_device,
        "throughput/tflops_per_device": per_device * flops.per_token / 1e12,
        "throughput/mfu": per_device * flops.per_token / peak_flops,
        "throughput/mfu_causal": per_device * flops.per_token_causal / peak_flops,
        "time/step_s": step_s,
    }
    if flops.recompute_per_token:
        # HFU also counts the recomputed forward work (Korthikanti et al. 2022, Sec. 6).
        hardware = flops.per_token + flops.recompute_per_token
        metrics["throughput/hfu"] = per_device * hardware / peak_flops
    return metrics
