"""The peak FLOP/s that MFU divides by: from the config, the device's name, or a measurement.

Order: ``cluster.peak_tflops`` (an explicit override) > the cluster group's dense figure
for the run's precision > on CUDA, the detected device's dense figure (an unknown device
is an error, never a silent fallback) > on CPU, a short matmul calibration, reported as
measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from runner.config import ClusterConfig, Precision
from runner.hardware import calibrate_cpu_peak, peak_flops_for_cuda_device, torch_dtype
from runner.summary import write_json_atomic


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s per device and where the figure came from."""

    flops: float
    source: str


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
    return best_cpu_peak(precision)


def _cache_path() -> Path:
    root = os.environ.get("LADDER_CACHE_DIR") or Path.home() / ".cache" / "ladder"
    return Path(root) / "cpu_peak.json"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def best_cpu_peak(precision: Precision) -> Peak:
    """The best matmul FLOP/s measured on this CPU at this thread count, now or in an earlier run.

    One calibration can land on a core another process holds, and then reads low; the
    peak is the most this CPU was seen to do, so the best figure across runs is kept in
    a small cache file (``$LADDER_CACHE_DIR`` or ``~/.cache/ladder/cpu_peak.json``).
    """
    threads = torch.get_num_threads()
    key = f"{_cpu_name()}|threads={threads}|{precision.value}"
    now = calibrate_cpu_peak(torch_dtype(precision))
    path = _cache_path()
    cache: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError):
        cache = json.loads(path.read_text())
    best = max(now, float(cache.get(key, 0.0)))
    cache[key] = best
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, cache)
    return Peak(
        best,
        f"measured: best matmul calibration seen on this CPU with {threads} threads "
        f"({now / 1e9:.1f} GFLOP/s this run; best kept in {path})",
    )


def planning_peak(cluster: ClusterConfig, precision: Precision) -> Peak | None:
    """The cluster's configured peak for planning; None when only a measurement could tell."""
    if cluster.peak_tflops is not None:
        return Peak(cluster.peak_tflops * 1e12, "cluster.peak_tflops")
    table = cluster.peak_tflops_fp32 if precision == Precision.fp32 else cluster.peak_tflops_bf16
    if table is None:
        return None
    return Peak(table * 1e12, f"cluster {cluster.name}")
