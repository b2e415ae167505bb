"""How fast this host's cores run now, against the fastest they were seen to run.

/proc/stat (runner/hardware/cpu_busy.py) sees other processes on this process's CPUs. It does
not see a hypervisor that deschedules a VM's virtual CPUs without reporting steal time: the
cores look idle while this process waits, and on a 2-core cloud VM every kernel then runs 20-90%
slower for seconds at a time. A calibration figure measured in
such a phase reads slow while the host looks quiet. A fixed reference timed beside a figure,
against the fastest it was ever timed on this host, says whether the host ran slow then.

The reference is :data:`REFERENCE_CALLS` 256 x 256 x 256 fp32 matmuls after a few of
warm-up, and its reading their mean call (10-20 ms in all on 2 cores): the mean carries the time
the process was stopped, where the median call would not (with the process stopped 1 ms in every
2, a call's median stayed at its quiet 170 µs while the mean doubled).
"""

from __future__ import annotations

import time

# A figure whose reference ran more than this many times the host's fastest reading is
# provisional (runner/step_time/measured/figures.py): below a process stopped half the time (2), above one
# thread's quiet readings (1.36 at most in 300, 1.25 at the 99th percentile, on a 2-core VM).
SLOW_PACE = 1.5
REFERENCE_SIZE = 256
REFERENCE_CALLS = 60
REFERENCE_WARMUP = 5


def reference_seconds() -> float:
    """The mean of REFERENCE_CALLS fp32 matmuls of REFERENCE_SIZE cubed, on torch's threads now."""
    import torch  # deferred: a plan of a datasheet cluster runs without torch; only a CPU's calibration paces

    a = torch.randn(REFERENCE_SIZE, REFERENCE_SIZE)
    b = torch.randn(REFERENCE_SIZE, REFERENCE_SIZE)
    for _ in range(REFERENCE_WARMUP):
        torch.mm(a, b)
    started = time.perf_counter()
    for _ in range(REFERENCE_CALLS):
        torch.mm(a, b)
    return (time.perf_counter() - started) / REFERENCE_CALLS


def slow(seconds: float, fastest: float | None) -> bool:
    """Whether a reference reading of ``seconds`` is a slow phase against the host's ``fastest``."""
    return fastest is not None and seconds > SLOW_PACE * fastest


__all__ = ["REFERENCE_CALLS", "SLOW_PACE", "reference_seconds", "slow"]
