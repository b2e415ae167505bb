"""The peak FLOP/s that MFU divides by: from the config, the device's name, or a measurement.

Order: ``cluster.peak_tflops`` (an explicit override) > the cluster group's dense figure
for the run's precision > on CUDA, the detected device's dense figure (an unknown device
is an error, never a silent fallback) > on CPU, a short matmul calibration, reported as
measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runner.config import ClusterConfig, Precision
from runner.hardware import calibrate_cpu_peak, peak_flops_for_cuda_device


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s per device and where the figure came from."""

    flops: float
    source: str


def _compute_dtype(precision: Precision) -> torch.dtype:
    return {
        Precision.fp32: torch.float32,
        Precision.bf16: torch.bfloat16,
        Precision.fp16: torch.float16,
    }[precision]


def resolve_peak(cluster: ClusterConfig, precision: Precision, *, accelerator: str) -> Peak:
    """The peak for this run; on CPU it measures (about half a second)."""
    if cluster.peak_tflops is not None:
        return Peak(cluster.peak_tflops * 1e12, "cluster.peak_tflops")
    table = cluster.peak_tflops_fp32 if precision == Precision.fp32 else cluster.peak_tflops_bf16
    if table is not None:
        field = "peak_tflops_fp32" if precision == Precision.fp32 else "peak_tflops_bf16"
        return Peak(table * 1e12, f"cluster {cluster.name}.{field}")
    if accelerator == "cuda":
        name = torch.cuda.get_device_name()
        return Peak(peak_flops_for_cuda_device(name, precision.value), f"dense datasheet figure for {name}")
    flops = calibrate_cpu_peak(_compute_dtype(precision))
    return Peak(flops, f"measured: matmul calibration on this CPU ({torch.get_num_threads()} threads)")


def planning_peak(cluster: ClusterConfig, precision: Precision) -> Peak | None:
    """The cluster's configured peak for planning; None when only a measurement could tell."""
    if cluster.peak_tflops is not None:
        return Peak(cluster.peak_tflops * 1e12, "cluster.peak_tflops")
    table = cluster.peak_tflops_fp32 if precision == Precision.fp32 else cluster.peak_tflops_bf16
    if table is None:
        return None
    return Peak(table * 1e12, f"cluster {cluster.name}")
