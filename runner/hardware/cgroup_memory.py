"""The memory cap of this process's cgroup: a container's limit, or a SLURM job's ``--mem``.

A process's cgroup is named in /proc/self/cgroup (cgroups(7)): ``0::/path`` under cgroup v2,
``N:memory:/path`` under v1's memory controller. A cap set on the process's own cgroup or on
any ancestor binds it (v2: ``memory.max``; v1: ``memory.limit_in_bytes``), so the limit is the
smallest along the way up to the hierarchy's mount point (found in /proc/self/mountinfo,
proc(5)). SLURM's task/cgroup plugin puts a job's cap on ``.../job_<id>`` and runs its tasks
in cgroups below it: reading only the mount point's own file, as a container's view allows,
misses it.
"""

from __future__ import annotations

import os
from pathlib import Path

NO_LIMIT = 2**60  # v1 writes "no limit" as a page-rounded 2**63 - 1; v2 as "max"
LIMIT_FILES = {"v2": "memory.max", "v1": "memory.limit_in_bytes"}


def _memory_mounts(mountinfo: str) -> dict[str, tuple[Path, str]]:
    """Per cgroup version, the mount point of its memory hierarchy and the root it shows."""
    mounts: dict[str, tuple[Path, str]] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) < 5 or len(kind) < 3:
            continue
        root, point = fields[3], Path(fields[4])
        if kind[0] == "cgroup2":
            mounts.setdefault("v2", (point, root))
        elif kind[0] == "cgroup" and "memory" in kind[2].split(","):
            mounts.setdefault("v1", (point, root))
    return mounts


def memory_cgroup_dirs(proc: Path = Path("/proc/self")) -> list[tuple[Path, str]]:
    """(folder, limit file name) of this process's memory cgroup and each ancestor, innermost first."""
    try:
        mounts = _memory_mounts((proc / "mountinfo").read_text())
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return []
    dirs = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        version = "v2" if controllers == "" else "v1" if "memory" in controllers.split(",") else None
        if version is None or version not in mounts:
            continue
        point, root = mounts[version]
        inside = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
        folder = (point / inside).resolve() if inside != "." else point
        while True:
            dirs.append((folder, LIMIT_FILES[version]))
            if folder == point or point not in folder.parents:
                break
            folder = folder.parent
    return dirs


def cgroup_memory_limit(proc: Path = Path("/proc/self")) -> int | None:
    """The smallest memory cap on this process's cgroup and its ancestors, in bytes; None if none."""
    limits = []
    for folder, name in memory_cgroup_dirs(proc):
        try:
            text = (folder / name).read_text().strip()
        except OSError:  # a hierarchy without the memory controller, or its root (v2 has no file there)
            continue
        if text.isdigit() and int(text) < NO_LIMIT:
            limits.append(int(text))
    return min(limits, default=None)
