"""How many of this process's CPUs other work held while it measured something.

A matmul calibration on cores another process (or, in a VM, the hypervisor) holds reads low
for as long as that process runs, so its rounds can agree with each other and still be wrong.
Linux's ``/proc/stat`` counts each CPU's busy time (user, nice, system, irq, softirq, steal);
less this process's own CPU time, over the wall time between two readings, it is the CPUs
others used. Only the CPUs this process may run on (its affinity) are counted.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# /proc/stat's columns after the CPU's name: user nice system idle iowait irq softirq steal ...
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def _cpus() -> set[int]:
    """The CPUs this process may run on."""
    with contextlib.suppress(AttributeError, OSError):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def _busy_seconds(cpus: set[int], text: str) -> float:
    """Seconds the given CPUs were busy since boot, from /proc/stat's text."""
    ticks = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        columns = [int(v) for v in rest.split()]
        ticks += sum(columns[i] for i in _BUSY_COLUMNS if i < len(columns))
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class OthersUse:
    """Started at construction; :meth:`cores` is the CPUs others used on average since then."""

    cpus: set[int]
    busy: float | None  # /proc/stat's busy seconds at the start; None where it cannot be read
    own: float  # CPU seconds of this process and its waited-for children at the start
    wall: float

    @classmethod
    def start(cls) -> OthersUse:
        """Read the counters now."""
        cpus = _cpus()
        return cls(cpus, _read_busy(cpus), _own_cpu_seconds(), time.perf_counter())

    def cores(self) -> float | None:
        """CPUs of this process's affinity that other processes kept busy since the start (None: unknown)."""
        busy = _read_busy(self.cpus)
        wall = time.perf_counter() - self.wall
        if busy is None or self.busy is None or wall <= 0:
            return None
        others = (busy - self.busy) - (_own_cpu_seconds() - self.own)
        return max(0.0, others / wall)


def _own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that ended and were waited for (a
    measurement run in a child process, runner/step_time/measured/zero3_overhead.py, is not others' work)."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


def _read_busy(cpus: set[int]) -> float | None:
    try:
        return _busy_seconds(cpus, PROC_STAT.read_text())
    except (OSError, ValueError):
        return None  # not Linux, or a /proc/stat this reader does not know
