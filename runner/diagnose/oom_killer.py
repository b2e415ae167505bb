"""Whether the kernel's out-of-memory killer ended a rank, and what the kernel said when it did.

A rank the OOM killer ends gets SIGKILL and raises nothing (the allocator's refusals, which
do raise, are runner/diagnose/out_of_memory.py's). Linux counts the killer's work (4.13 and later):

- host-wide, ``oom_kill`` in /proc/vmstat;
- per memory cgroup (mm/memcontrol.c ``memcg_memory_event``): cgroup v2's ``oom_kill`` in
  ``memory.events`` counts the cgroup's processes and its descendants'; v1's, in
  ``memory.oom_control``, the cgroup's own processes, whichever cap, its own or an
  ancestor's, ran out.

The launcher reads both before the ranks start (:func:`read_counts`) and again after one dies
of SIGKILL: a count that rose says the killer was at work while the run ran, in the run's
cgroup or elsewhere on the host; counts that stayed put say another process sent the signal.
The kernel's log names each victim (mm/oom_kill.c ``__oom_kill_process``): "Memory cgroup out
of memory: Killed process <pid> (<comm>) total-vm:<kB>kB, anon-rss:<kB>kB, ..." when a cgroup's
cap ran out, "Out of memory: Killed process ..." when the host did. It is read from
/dev/kmsg where this user may (root, or ``kernel.dmesg_restrict=0``); its pids are the
host's, so a rank is found there only outside a container's pid namespace.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from runner.hardware.cgroup_memory import memory_cgroup_dirs

# The count's file and its line's key, by the limit file that names the cgroup version.
COUNT_FILES = {"memory.max": "memory.events", "memory.limit_in_bytes": "memory.oom_control"}
KILLED = re.compile(
    r"(?P<why>Memory cgroup out of memory|Out of memory)[^:]*: Killed process (?P<pid>\d+) "
    r"\((?P<comm>[^)]*)\)[^\n]*?anon-rss:(?P<anon_kb>\d+)kB"
)
KMSG_LIMIT = 16 * 2**20  # the kernel's ring buffer is 2**CONFIG_LOG_BUF_SHIFT bytes, 16 MB at most


def _count(path: Path, key: str = "oom_kill") -> int | None:
    """The value of ``key`` in a "key value" per-line file, or None if the file or key is missing."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


@dataclass(frozen=True)
class OomCounts:
    """The kernel's counts of out-of-memory kills at one moment; None where it could not be read."""

    host: int | None
    cgroup: int | None
    cgroup_dir: Path | None  # the innermost memory cgroup of this process with a count


def read_counts(proc: Path = Path("/proc")) -> OomCounts:
    """The host's count (/proc/vmstat) and this process's memory cgroup's, the ranks' own."""
    cgroup, cgroup_dir = None, None
    for folder, limit_file in memory_cgroup_dirs(proc / "self"):
        cgroup = _count(folder / COUNT_FILES[limit_file])
        if cgroup is not None:
            cgroup_dir = folder
            break
    return OomCounts(host=_count(proc / "vmstat"), cgroup=cgroup, cgroup_dir=cgroup_dir)


def kernel_log(kmsg: Path = Path("/dev/kmsg")) -> str:
    """The kernel's log records still in its ring buffer, "" where this user may not read them.

    /dev/kmsg gives one record per read (Documentation/ABI/testing/dev-kmsg); opened without
    blocking, a read past the last record fails with EAGAIN, and one whose record was
    overwritten meanwhile with EPIPE, after which reading goes on.
    """
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    records: list[str] = []
    size = 0
    try:
        while size < KMSG_LIMIT:
            try:
                record = os.read(fd, 8192)
            except OSError as error:
                if error.errno == errno.EPIPE:
                    continue
                break  # EAGAIN: the end; EPERM, EINVAL: nothing to be read here
            if not record:
                break
            records.append(record.decode(errors="replace").partition(";")[2])
            size += len(record)
    finally:
        os.close(fd)
    return "".join(records)


def killed_line(pid: int, log: str) -> re.Match[str] | None:
    """The kernel log's last "Killed process <pid>" line, or None."""
    found = None
    for match in KILLED.finditer(log):
        if int(match["pid"]) == pid:
            found = match
    return found


@dataclass(frozen=True)
class KillVerdict:
    """Whether the out-of-memory killer ended a process, and the evidence in words."""

    by_oom_killer: bool
    words: str


def killer_verdict(
    before: OomCounts, pid: int | None, *, log: str | None = None, proc: Path = Path("/proc")
) -> KillVerdict | None:
    """Whether the out-of-memory killer ended process ``pid``; None if nothing can tell.

    ``before`` is :func:`read_counts` from before the process started; ``log`` the kernel's
    (:func:`kernel_log` when None).
    """
    after = read_counts(proc)
    match = killed_line(pid, kernel_log() if log is None else log) if pid is not None else None
    if match is not None:
        what = "its memory cgroup's cap" if match["why"].startswith("Memory cgroup") else "this host's memory"
        resident = int(match["anon_kb"]) * 1024 / 1e9
        return KillVerdict(
            True,
            f"the kernel's out-of-memory killer ended it, {what} spent, at {resident:.2f} GB resident "
            f"(kernel log: {match.group(0)})",
        )
    rises = []
    if before.cgroup is not None and after.cgroup is not None and after.cgroup > before.cgroup:
        rises.append(f"{after.cgroup - before.cgroup} in the run's memory cgroup ({before.cgroup_dir})")
    if before.host is not None and after.host is not None and after.host > before.host:
        rises.append(f"{after.host - before.host} on this host (/proc/vmstat oom_kill)")
    if rises:
        at_work = "the kernel's out-of-memory killer was at work while it ran: "
        return KillVerdict(True, at_work + " and ".join(rises))
    if before.host is None or after.host is None:
        return None
    return KillVerdict(
        False,
        "not by the kernel's out-of-memory killer, which ended nothing on this host while the run ran "
        "(/proc/vmstat oom_kill): another process sent it (kill -9, a scheduler after its grace time)",
    )
