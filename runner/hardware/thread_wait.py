"""How a CPU rank's threads wait for each other: spinning on quiet cores, sleeping on busy ones.

torch's CPU kernels split each op over the rank's threads (its OpenMP intra-op pool) and meet at
a barrier after it. GNU OpenMP's default lets a thread that reaches the barrier first spin for a
while before it sleeps (libgomp's ``GOMP_SPINCOUNT``; ``OMP_WAIT_POLICY`` in the OpenMP 5.2
specification, Sec. 21.2.3: ``PASSIVE`` waiters yield their CPU, ``ACTIVE`` ones spin). On cores
of its own that is the quickest way to meet. On cores other processes hold, the spinning thread
takes the slice its late partner needs, and every op waits the longer.

Measured with ``make run``'s default experiment (one rank, two threads, tiny, 25 steps) on a 2-core
AMD EPYC VM, median step seconds: quiet 0.290 by default and 0.347 with ``PASSIVE``; beside two
``python3 -c 'while 1: pass'`` 1.21 by default, 0.88 with ``PASSIVE``, 2.48 with ``ACTIVE``. So a
launcher on a busy host gives its CPU ranks ``OMP_WAIT_POLICY=PASSIVE`` (:func:`wait_policy`),
and a quiet host keeps the default. A policy the user set is kept.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from runner.hardware.cpu_busy import OthersUse

WAIT_POLICY = "OMP_WAIT_POLICY"
# Other processes holding at least half a core of this process's CPUs make the host busy.
BUSY_CORES = 0.5
SAMPLE_S = 0.1  # how long the launcher watches the cores before it decides: 10 of /proc/stat's ticks


@dataclass(frozen=True)
class WaitPolicy:
    """What a launcher adds to its CPU ranks' environment, and why, in one line (empty: nothing)."""

    env: Mapping[str, str]
    words: str


def wait_policy(*, cpu_rank: bool, environ: Mapping[str, str], others_cores: float | None) -> WaitPolicy:
    """``OMP_WAIT_POLICY=PASSIVE`` for CPU ranks where other processes hold ``others_cores`` >=
    :data:`BUSY_CORES` of this host's cores; nothing on a quiet host, for GPU ranks, where the
    cores' use is unknown or where ``environ`` already sets a policy."""
    if not cpu_rank or WAIT_POLICY in environ or others_cores is None or others_cores < BUSY_CORES:
        return WaitPolicy({}, "")
    words = (
        f"other processes hold {others_cores:.1f} of this host's cores: the ranks' threads sleep while "
        f"they wait for each other ({WAIT_POLICY}=PASSIVE; set {WAIT_POLICY} to choose)"
    )
    return WaitPolicy({WAIT_POLICY: "PASSIVE"}, words)


def others_cores_now(sample_s: float = SAMPLE_S) -> float | None:
    """The cores other processes held over the next ``sample_s`` seconds (None: unknown)."""
    watch = OthersUse.start()
    time.sleep(sample_s)
    return watch.cores()


__all__ = ["BUSY_CORES", "WAIT_POLICY", "WaitPolicy", "others_cores_now", "wait_policy"]
