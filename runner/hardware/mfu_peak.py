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
from runner.hardware.cpu_half_matmul import computes_in_fp32
from runner.hardware.peak_flops import calibrate_cpu_peak, peak_flops_for_cuda_device, torch_dtype
from runner.rundir.summary import write_json_atomic


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s per device and where the figure came from."""

    flops: float
    source: str
    calibrated: bool = False  # this CPU's matmul calibration (best_cpu_peak), not a figure given


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


# Calibrations at one key (CPU, threads, precision) before its best is reused unmeasured.
CALIBRATIONS_KEPT = 3


@dataclass
class _CpuPeakCache:
    """The cache file: each key's best FLOP/s at the top level, and under ``"calibrations"``
    how many runs measured it (a file without counts, or a key without one, counts once)."""

    best: dict[str, float]
    calibrations: dict[str, int]

    @classmethod
    def read(cls, path: Path) -> _CpuPeakCache:
        raw: object = {}
        with contextlib.suppress(OSError, ValueError):
            raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raw = {}
        best = {key: float(value) for key, value in raw.items() if isinstance(value, int | float)}
        counts = raw.get("calibrations")
        counts = counts if isinstance(counts, dict) else {}
        return cls(best, {key: int(counts.get(key, 1)) for key in best})

    def write(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {**self.best, "calibrations": self.calibrations})


def _cache_key(precision: Precision) -> str:
    """This CPU, this process's thread count, the precision and whether its 16-bit matmuls run
    in fp32 (runner/hardware/cpu_half_matmul.py): one calibration's conditions."""
    widened = "|fp32-matmul" if computes_in_fp32(torch_dtype(precision)) else ""
    return f"{_cpu_name()}|threads={torch.get_num_threads()}|{precision.value}{widened}"


def best_cpu_peak(precision: Precision) -> Peak:
    """The best matmul FLOP/s measured on this CPU at this thread count, now or in an earlier run.

    One calibration can land on a core another process holds, and then reads low; the
    peak is the most this CPU was seen to do, so the best figure across runs is kept in
    a small cache file (``$LADDER_CACHE_DIR`` or ``~/.cache/ladder/cpu_peak.json``). Once
    CALIBRATIONS_KEPT runs have measured at this key, their best is reused without a new
    measurement (about half a second per process); removing the file measures again.
    """
    threads = torch.get_num_threads()
    conditions = f"{threads} threads"
    if computes_in_fp32(torch_dtype(precision)):
        conditions += f", {precision.value} matmuls computed in fp32"
    key = _cache_key(precision)
    path = _cache_path()
    cache = _CpuPeakCache.read(path)
    if cache.calibrations.get(key, 0) >= CALIBRATIONS_KEPT:
        return Peak(
            cache.best[key],
            f"measured: best of {cache.calibrations[key]} matmul calibrations on this CPU with "
            f"{conditions} (kept in {path}; remove it to measure again)",
            calibrated=True,
        )
    now = calibrate_cpu_peak(torch_dtype(precision))
    cache = _CpuPeakCache.read(path)  # again: another rank or run may have written since
    cache.best[key] = max(now, cache.best.get(key, 0.0))
    cache.calibrations[key] = cache.calibrations.get(key, 0) + 1
    cache.write(path)
    return Peak(
        cache.best[key],
        f"measured: best matmul calibration seen on this CPU with {conditions} "
        f"({now / 1e9:.1f} GFLOP/s this run; best kept in {path})",
        calibrated=True,
    )


def above_calibrated_peak(peak: Peak, mfu: float | None, precision: Precision) -> str | None:
    """Where a run's MFU over a calibrated CPU peak is above 1, the calibrations ran on busy cores:
    the next runs at this key calibrate again (the best kept stays a floor: a new figure is kept
    only if higher). Returns the warning to log, or None."""
    if not peak.calibrated or mfu is None or not mfu > 1:
        return None
    path = _cache_path()
    cache = _CpuPeakCache.read(path)
    key = _cache_key(precision)
    if key in cache.best:
        cache.calibrations[key] = 0
        cache.write(path)
    return (
        f"MFU {mfu:.2f} is above 1: this CPU did more than the peak calibrated earlier "
        f"({peak.flops / 1e9:.1f} GFLOP/s, on cores other processes held); the next runs calibrate "
        f"again ({path})"
    )


def planning_peak(cluster: ClusterConfig, precision: Precision) -> Peak | None:
    """The cluster's configured peak for planning; None when only a measurement could tell."""
    if cluster.peak_tflops is not None:
        return Peak(cluster.peak_tflops * 1e12, "cluster.peak_tflops")
    table = cluster.peak_tflops_fp32 if precision == Precision.fp32 else cluster.peak_tflops_bf16
    if table is None:
        return None
    return Peak(table * 1e12, f"cluster {cluster.name}")
