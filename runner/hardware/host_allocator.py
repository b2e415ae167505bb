"""The C allocator a CPU rank runs with (``train.host_allocator``), as environment for its process.

glibc's malloc serves every allocation above its mmap threshold (at most 32 MiB on a 64-bit
host, malloc(3) ``M_MMAP_THRESHOLD``) from fresh pages and unmaps them at free. A training
step allocates its largest tensors afresh each micro-batch (the logits and their gradients,
the vocabulary matrices' gradients, the flattened gradients of an all-reduce), so each pays
the kernel's page faults: 5.5 GB/s into fresh pages against 30-48 GB/s into warm ones on a
2-core Xeon VM, and far slower, and erratic, where the hypervisor reclaims freed guest pages
(free page reporting): a 124M-parameter model's backward varied between 1.9 and 5.6 s from
step to step there.

jemalloc (``libjemalloc.so.2``, Debian's ``libjemalloc2``) keeps what a rank frees and hands
it out again: with ``dirty_decay_ms:-1,muzzy_decay_ms:-1`` it never returns pages to the
kernel (jemalloc's TUNING.md), as CUDA's caching allocator keeps device memory, and a
step pays no page faults once its sizes have been seen. ``lg_extent_max_active_fit:30`` lets
it cut any kept extent for any request: by default (6) it will not split a free extent more than
64 times the request, and as a step's freed tensors merge into extents that large, its small
tensors take fresh pages instead, every step, never to be returned. gpt2_124m's rank grew by
66-75 MB a step that way (4.0 to 5.75 GB RSS over 24 steps, a third of a 2-rank step in the
kernel's page faults); with it, the rank holds 3.85 GB from its second step on. PyTorch's own
CPU launcher preloads jemalloc for the same reason (``torch.backends.xeon.run_cpu
--enable-jemalloc``). The cost is a high-water RSS: freed memory stays the rank's.

A CPU rank gets it by ``LD_PRELOAD`` when its launcher starts it (launchers/local.py; under SLURM,
the cell's batch script: launchers/slurm/submission.py ``allocator_lines``); a rank on a GPU keeps
the system's allocator (its large tensors live in CUDA's).
"""

from __future__ import annotations

import ctypes.util
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from runner.config import HostAllocator

JEMALLOC_SONAME = "libjemalloc.so.2"
# Never purge freed pages (jemalloc's opt.dirty_decay_ms, opt.muzzy_decay_ms: -1 disables decay),
# and reuse them for any size (opt.lg_extent_max_active_fit: log2 of the largest free extent split
# for a request, at most 64; the module's docstring says why).
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1,lg_extent_max_active_fit:30"
INSTALL_HINT = "apt-get install libjemalloc2"


@functools.cache
def jemalloc_installed() -> bool:
    """Whether the dynamic loader finds libjemalloc (ldconfig's cache, as LD_PRELOAD of a bare name
    searches it)."""
    return ctypes.util.find_library("jemalloc") is not None


@dataclass(frozen=True)
class RankAllocator:
    """The allocator a rank will run with, and the environment that gives it."""

    name: str  # "jemalloc" or "system"
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def keeps_freed_memory(self) -> bool:
        """True when a freed tensor's pages stay the rank's: a later allocation pays no page faults."""
        return self.name == "jemalloc"


def allocator_problem(choice: HostAllocator, *, installed: bool | None = None) -> str | None:
    """Why ``choice`` cannot be honoured on this host (None: it can)."""
    installed = jemalloc_installed() if installed is None else installed
    if choice == HostAllocator.jemalloc and not installed:
        return (
            f"train.host_allocator=jemalloc: {JEMALLOC_SONAME} is not installed on this host; "
            f"install it ({INSTALL_HINT}) or set train.host_allocator=auto (the C library's "
            "malloc where jemalloc is missing)"
        )
    return None


def rank_allocator(
    choice: HostAllocator,
    *,
    cpu_rank: bool,
    environ: Mapping[str, str],
    installed: bool | None = None,
) -> RankAllocator:
    """The allocator of a rank started with ``environ`` (its launcher's), ``cpu_rank`` when it trains
    on the CPU. ``auto`` takes jemalloc on a CPU rank where it is installed; ``jemalloc`` where it is
    not is refused before launch (:func:`allocator_problem`)."""
    installed = jemalloc_installed() if installed is None else installed
    wanted = choice == HostAllocator.jemalloc or (choice == HostAllocator.auto and cpu_rank)
    if not (wanted and installed):
        return RankAllocator("system")
    preload = " ".join(p for p in (JEMALLOC_SONAME, environ.get("LD_PRELOAD", "")) if p)
    conf = ",".join(c for c in (JEMALLOC_CONF, environ.get("MALLOC_CONF", "")) if c)
    return RankAllocator("jemalloc", {"LD_PRELOAD": preload, "MALLOC_CONF": conf})


def default_cpu_rank_env(environ: Mapping[str, str]) -> Mapping[str, str]:
    """What a CPU rank started from ``environ`` adds to it by default (``train.host_allocator=auto``):
    for a calibration's child processes, which should allocate as the ranks they stand in for."""
    return rank_allocator(HostAllocator.auto, cpu_rank=True, environ=environ).env


def running_allocator(maps: str) -> str:
    """The allocator this process runs with, read from ``/proc/self/maps``'s text."""
    return "jemalloc" if "libjemalloc" in maps else "system"


__all__ = [
    "INSTALL_HINT",
    "JEMALLOC_CONF",
    "JEMALLOC_SONAME",
    "RankAllocator",
    "allocator_problem",
    "default_cpu_rank_env",
    "jemalloc_installed",
    "rank_allocator",
    "running_allocator",
]
