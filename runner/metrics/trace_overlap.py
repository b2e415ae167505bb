"""Exposed communication on CUDA, read from a profiled step's kernels on the device's timeline.

NCCL collectives return to the host once queued, so the host cannot time what a collective
leaves exposed (runner/metrics/comm_timer.py measures it on CPU only). The device's own timeline
can: the trace of the profiled step (``train.profile_step``, runner/metrics/step_profiler.py) holds
every kernel with its start and duration, on every stream. Communication is exposed where
a collective kernel runs and no compute kernel runs beside it:

    exposed = | U(collective kernels) \\ U(compute kernels) |

the complement of what Holistic Trace Analysis calls the communication-computation overlap
(HTA ``get_comm_comp_overlap``: the share of communication time with compute running). A
collective kernel is NCCL's (its name holds ``nccl``); memory copies and sets are neither
(the Chrome trace files them under their own categories, not ``kernel``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The disjoint, sorted intervals covering the same time as ``intervals``."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a: list[Interval], b: list[Interval]) -> float:
    """Time two disjoint, sorted interval lists share."""
    shared, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        shared += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return shared


def exposed(collectives: Iterable[Interval], compute: Iterable[Interval]) -> float:
    """Time covered by ``collectives`` and by no interval of ``compute``."""
    comm = union(collectives)
    return _length(comm) - _overlap(comm, union(compute))


def kernel_intervals(events: Iterable[dict[str, Any]]) -> tuple[list[Interval], list[Interval]]:
    """The Chrome trace's device kernels as (collective, compute) intervals, in microseconds."""
    collectives: list[Interval] = []
    compute: list[Interval] = []
    for event in events:
        if event.get("cat") != "kernel" or event.get("ph") != "X":
            continue
        interval = (float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0.0)))
        (collectives if "nccl" in event.get("name", "").lower() else compute).append(interval)
    return collectives, compute


def device_comm(trace: Path) -> dict[str, float]:
    """The profiled step's collective kernel time and the part of it exposed, in seconds."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    collectives, compute = kernel_intervals(events)
    return {
        "comm_kernels_s": _length(union(collectives)) / 1e6,
        "comm_exposed_s": exposed(collectives, compute) / 1e6,
    }


__all__ = ["device_comm", "exposed", "kernel_intervals", "union"]
