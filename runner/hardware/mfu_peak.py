"""The peak FLOP/s that MFU divides by: from the config, the device's name, or a measurement.

Order: ``cluster.peak_tflops`` (an explicit override) > the cluster group's dense figure
for the run's precision > on CUDA, the detected device's dense figure (an unknown device
is an error, never a silent fallback) > on CPU, a matmul calibration made once per machine
(CPU, threads per rank, precision, torch version), reported as measured with its thread count.
:func:`resolve_peak` is that order, for a run's MFU, the plan's device (runner/step_time/device_figures.py)
and the refusal of an unknown CUDA device (runner/preflight/validate.py) alike.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from runner.config import ClusterConfig, Precision
from runner.hardware.cpu_busy import OthersUse
from runner.hardware.peak_flops import calibrate_cpu_rounds, peak_flops_for_cuda_device, torch_dtype
from runner.rundir.atomic_json import write_json_atomic
from runner.rundir.summary_records import CpuCalibration, PeakCalibrationRecord

# Where a peak came from: cluster.peak_tflops, the cluster group's figure for the precision, the
# CUDA device's datasheet figure, or this CPU's matmul calibration.
PeakOrigin = Literal["config", "cluster", "datasheet", "measured"]


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s per device and where the figure came from."""

    flops: float
    source: str
    calibrated: bool = False  # this CPU's matmul calibration (best_cpu_peak), not a figure given
    detail: CpuCalibration | None = None  # a calibration's record: its rounds, threads, torch, date
    origin: PeakOrigin = "config"

    def calibration_record(self, *, ranks: int) -> PeakCalibrationRecord | None:
        """summary.json's ``peak_flops_calibration``: the calibration and the run's ranks x threads."""
        if self.detail is None:
            return None
        threads = int(self.detail["threads"])
        return {**self.detail, "ranks": ranks, "threads_per_rank": threads, "threads_in_all": ranks * threads}


def cluster_peak_key(precision: Precision) -> str:
    """The cluster key that holds the dense peak for ``precision`` (fp16 runs at bf16's)."""
    return "peak_tflops_fp32" if precision == Precision.fp32 else "peak_tflops_bf16"


def resolve_peak(
    cluster: ClusterConfig,
    precision: Precision,
    *,
    accelerator: str,
    ranks: int = 1,
    cpu_peak: Callable[[Precision], Peak] | None = None,
) -> Peak:
    """The peak for this run, in the module docstring's order; on CPU the calibration kept for this
    machine (measured once, 1.4 s), or ``cpu_peak(precision)`` where the caller keeps its own.

    Raises UnknownDeviceError (runner/hardware/peak_flops.py) for a CUDA device the table does not
    know, unless the cluster gives the peak.
    """
    if cluster.peak_tflops is not None:
        return Peak(cluster.peak_tflops * 1e12, "cluster.peak_tflops")
    key = cluster_peak_key(precision)
    table = getattr(cluster, key)
    if table is not None:
        return Peak(table * 1e12, f"cluster {cluster.name}.{key}", origin="cluster")
    if accelerator == "cuda":
        import torch  # deferred: only a CUDA rank, or a launch beside CUDA devices, gets here

        name = torch.cuda.get_device_name()
        figure = peak_flops_for_cuda_device(name, precision.value)
        return Peak(figure, f"datasheet: dense, {name}", origin="datasheet")
    if cpu_peak is not None:
        return cpu_peak(precision)
    return best_cpu_peak(precision, ranks=ranks)


def _cache_path() -> Path:
    root = os.environ.get("LADDER_CACHE_DIR") or Path.home() / ".cache" / "ladder"
    return Path(root) / "cpu_peak.json"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# The statistic kept of a calibration's rounds (runner/hardware/peak_flops.py calibrate_cpu_rounds):
# a high percentile, not the best round (one lucky round would set every later run's MFU) nor
# the median (rounds that another process slowed pull it down; none can speed one up).
PERCENTILE = 80
# A calibration is kept for good when no other process held this process's cores during it
# (runner/hardware/cpu_busy.py: at most BUSY_CORES beyond the cores the run's other ranks use)
# and its rounds agree within SETTLED_SPREAD (IQR over median), as on quiet cores they do.
# Otherwise the next runs calibrate again and the highest figure is kept meanwhile (another
# process only ever slows a round); rounds that disagree on quiet cores, up to TRIES times; a
# figure from busy cores (provisional) once a run finds the cores quiet.
SETTLED_SPREAD = 0.10
BUSY_CORES = 0.25
TRIES = 3
CACHE_VERSION = 2  # the format below; an earlier file (best-of figures) is measured anew


def _percentile(values: list[float], percent: int) -> float:
    """The ``percent``-th percentile of ``values``, linear between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * percent / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _spread(values: list[float]) -> float:
    """Interquartile range over median."""
    q1, median, q3 = (_percentile(values, p) for p in (25, 50, 75))
    return (q3 - q1) / median if median > 0 else float("inf")


def _read_file(path: Path) -> dict[str, Any]:
    """The cache file's content; empty when it is absent, unreadable or of an earlier format."""
    raw: object = {}
    with contextlib.suppress(OSError, ValueError):
        raw = json.loads(path.read_text())
    return raw if isinstance(raw, dict) and raw.get("version") == CACHE_VERSION else {}


def _peaks_of(kept: dict[str, Any]) -> dict[str, CpuCalibration]:
    """The calibrations in the cache file's content ``kept``, by key."""
    peaks = kept.get("peaks")
    if not isinstance(peaks, dict):
        return {}
    return {key: entry for key, entry in peaks.items() if _usable(entry)}


def _keys_of(kept: dict[str, Any]) -> dict[str, str]:
    """The calibration keys worked out before, by the conditions of the process that worked them out
    (:func:`_conditions`), in the cache file's content ``kept``."""
    keys = kept.get("keys")
    return {k: v for k, v in keys.items() if isinstance(v, str)} if isinstance(keys, dict) else {}


def _read_cache(path: Path) -> dict[str, CpuCalibration]:
    """The calibrations kept, by key."""
    return _peaks_of(_read_file(path))


def _read_keys(path: Path) -> dict[str, str]:
    """The calibration keys worked out before (:func:`_keys_of`)."""
    return _keys_of(_read_file(path))


def _usable(entry: object) -> bool:
    """Whether a kept calibration holds what a run reads of it (a hand-edited one may not)."""
    if not isinstance(entry, dict) or not {"statistic", "spread", "threads"} <= entry.keys():
        return False
    flops = entry.get("flops")
    return isinstance(flops, int | float) and flops > 0


def _write_cache(path: Path, peaks: dict[str, CpuCalibration], keys: dict[str, str] | None = None) -> None:
    """Write the calibrations, and the keys worked out (those already kept where ``keys`` is None)."""
    keys = _read_keys(path) if keys is None else keys
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"version": CACHE_VERSION, "peaks": peaks, "keys": keys})


def _cache_key(precision: Precision) -> str:
    """This CPU, this process's thread count, the precision, whether its 16-bit matmuls run in fp32
    (runner/hardware/cpu_half_matmul.py) and torch's version: one calibration's conditions."""
    import torch  # deferred: the key asks torch; _conditions keeps a launching process without it

    from runner.hardware.cpu_half_matmul import computes_in_fp32

    widened = "|fp32-matmul" if computes_in_fp32(precision.torch_dtype) else ""
    threads = torch.get_num_threads()
    return f"{_cpu_name()}|threads={threads}|{precision.value}{widened}|torch={torch.__version__}"


# The environment variables that set the thread count torch starts with (with the cores the process
# may use): torch's intra-op pool reads OMP_NUM_THREADS, and MKL its own.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _torch_loaded() -> bool:
    return "torch" in sys.modules


def _conditions(precision: Precision) -> str:
    """What decides the calibration key of a process that has not loaded torch: this CPU, the cores
    it may run on and the thread variables (which fix the thread count torch will start with),
    torch's installed version and the precision.

    A launching process plans and sizes without torch, which takes one to three seconds of a core
    to load: the first such process to find the key records it under these conditions, and later
    ones read it. A process that has loaded torch (a rank, which sets its own thread count) asks
    torch itself.
    """
    try:
        installed = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        installed = "none"
    cores = len(os.sched_getaffinity(0))
    variables = ",".join(f"{name}={os.environ[name]}" for name in THREAD_VARIABLES if name in os.environ)
    return f"{_cpu_name()}|cores={cores}|{variables}|torch={installed}|{precision.value}"


def _calibration(precision: Precision, earlier: CpuCalibration | None) -> CpuCalibration:
    """Measure this CPU's rounds now; the entry kept for them, given the one an earlier run kept."""
    import torch  # deferred: see _conditions

    from runner.hardware.cpu_half_matmul import computes_in_fp32

    threads = torch.get_num_threads()
    others = OthersUse.start()
    rounds = calibrate_cpu_rounds(precision.torch_dtype)
    others_cores = others.cores()
    # The cores this rank does not use are the run's other ranks' (runner/engine/distributed.py
    # gives each rank its share): only others beyond them slowed the rounds.
    busy = others_cores is not None and others_cores > max(0, len(others.cpus) - threads) + BUSY_CORES
    spread = _spread(rounds)
    measured: CpuCalibration = {
        "flops": _percentile(rounds, PERCENTILE),
        "statistic": f"{PERCENTILE}th percentile of {len(rounds)} matmul rounds",
        "rounds": rounds,
        "spread": spread,
        "others_cores": others_cores,  # CPUs other processes kept busy meanwhile (None: unknown)
        "busy": busy,
        "settled": not busy and spread <= SETTLED_SPREAD,
        "tries": int((earlier or {}).get("tries", 0)) + (0 if busy else 1),  # quiet calibrations so far
        "threads": threads,
        "precision": precision.value,
        "fp32_matmul": computes_in_fp32(precision.torch_dtype),
        "cpu": _cpu_name(),
        "torch": torch.__version__,
        "calibrated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if earlier is None or measured["settled"] or measured["flops"] >= earlier["flops"]:
        return measured
    return {**earlier, "tries": measured["tries"]}  # slowed now: the earlier, higher figure stays


QUIET_LOOK_S = 0.25  # how long a run watches the cores before calibrating a provisional figure again


def _quiet_now(threads: int) -> bool:
    """Whether the cores are quiet now (as :func:`_calibration` counts busy) for a process on
    ``threads`` threads, over a short look."""
    others = OthersUse.start()
    time.sleep(QUIET_LOOK_S)
    cores = others.cores()
    return cores is not None and cores <= max(0, len(others.cpus) - threads) + BUSY_CORES


def _final(entry: CpuCalibration | None) -> bool:
    """Whether a kept calibration is reused unmeasured: settled, or spread on quiet cores TRIES times;
    a provisional one (measured on busy cores) while the cores are still busy."""
    if entry is None:
        return False
    if entry.get("busy"):
        return not _quiet_now(int(entry["threads"]))
    return bool(entry.get("settled")) or int(entry.get("tries", 0)) >= TRIES


def best_cpu_peak(precision: Precision, *, ranks: int = 1) -> Peak:
    """This CPU's matmul FLOP/s at this process's thread count, calibrated once and then reused.

    A process that has not loaded torch finds the calibration without loading it where an earlier
    process under the same conditions worked out its key (:func:`_conditions`).

    The calibration (runner/hardware/peak_flops.py calibrate_cpu_rounds, about 1.4 s) keeps the
    PERCENTILE-th percentile of several short rounds in a small cache file (``$LADDER_CACHE_DIR``
    or ``~/.cache/ladder/cpu_peak.json``), by CPU, threads, precision and torch version: every
    later run on this machine divides by the same figure, so MFU compares run to run. Rounds that
    disagree (another process held a core) are measured again in the next runs, up to TRIES.
    ``ranks``: the run's ranks, each on this many threads (for the source's words only).
    """
    path = _cache_path()
    conditions = None if _torch_loaded() else _conditions(precision)
    kept = _read_file(path)
    key = _keys_of(kept).get(conditions) if conditions else None
    entry = _peaks_of(kept).get(key) if key else None
    if not _final(entry):
        key = _cache_key(precision)
        entry = _peaks_of(kept).get(key)
        measured = not _final(entry)
        if measured:
            entry = _calibration(precision, entry)
        if measured or (conditions and _keys_of(kept).get(conditions) != key):
            assert entry is not None
            now = _read_file(path)  # again: another rank or run may have written since
            peaks, keys = _peaks_of(now), _keys_of(now)
            peaks[key] = entry
            if conditions:
                keys[conditions] = key
            _write_cache(path, peaks, keys)
    assert entry is not None
    source = _source(entry, ranks=ranks, path=path)
    return Peak(entry["flops"], source, calibrated=True, detail=entry, origin="measured")


def _source(entry: CpuCalibration, *, ranks: int, path: Path) -> str:
    """summary.json's peak_flops_source for a calibrated CPU peak."""
    threads = int(entry["threads"])
    per_rank, run = _count(threads, "thread"), _count(ranks, "rank")
    conditions = f"{per_rank} per rank (this run: {run} x {per_rank} = {ranks * threads} in all)"
    if entry.get("fp32_matmul", False) or _widened_before(entry):
        conditions += f", {entry['precision']} matmuls computed in fp32"
    state = ""
    if entry.get("busy"):
        state = (
            f"; provisional: other processes held {entry['others_cores']:.1f} cores, calibrating again "
            "once they are quiet"
        )
    elif not entry.get("settled"):
        again = "calibrating again" if not _final(entry) else f"kept after {entry.get('tries')} calibrations"
        state = f"; its rounds spread {100 * entry['spread']:.0f}%, {again}"
    return (
        f"measured: {entry['statistic']} on this CPU with {conditions} (calibrated "
        f"{str(entry.get('calibrated_at', '?'))[:10]}, torch {entry.get('torch')}{state}; kept in {path}, "
        "remove it to measure again)"
    )


def _widened_before(entry: CpuCalibration) -> bool:
    """For a calibration kept before entries said it: whether its 16-bit matmuls ran in fp32."""
    if "fp32_matmul" in entry or not entry.get("precision"):
        return False
    from runner.hardware.cpu_half_matmul import computes_in_fp32  # deferred: loads torch

    return computes_in_fp32(torch_dtype(entry["precision"]))


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def above_calibrated_peak(peak: Peak, mfu: float | None, precision: Precision) -> str | None:
    """Where a run's MFU over a calibrated CPU peak is above 1, the calibration ran on busy cores:
    the next run at this key calibrates again (and keeps the higher figure unless its rounds agree).
    Returns the warning to log, or None."""
    if not peak.calibrated or mfu is None or not mfu > 1:
        return None
    path = _cache_path()
    peaks = _read_cache(path)
    key = _cache_key(precision)
    if key in peaks:
        peaks[key] = {**peaks[key], "settled": False, "tries": 0}
        _write_cache(path, peaks)
    return (
        f"MFU {mfu:.2f} is above 1: this CPU did more than the peak calibrated earlier "
        f"({peak.flops / 1e9:.1f} GFLOP/s, on cores other processes held); the next runs calibrate "
        f"again ({path})"
    )
