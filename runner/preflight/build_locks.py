"""Stale locks of torch's extension builds, which make a run wait forever without a word.

DeepSpeed builds some of its ops the first time a run needs them (the CPU collectives'
shared-memory op, DeepSpeedCPUAdam for offload), through ``torch.utils.cpp_extension``.
The build takes a ``lock`` file in the op's build folder (``torch.utils.file_baton``:
created with ``O_EXCL`` and held open until the build ends, then removed). A run killed
during the build leaves the file behind, and every later run that needs the op waits on
it, with no output, for ever.

Before the ranks start, the lead process looks at each lock:

- held open by a process on this machine: a build in progress; left alone.
- held by no process here, on a local filesystem: nothing can be building behind it;
  removed, and the op is built again by the run that needs it.
- held by no process here, on a filesystem other nodes may share (NFS, Lustre, ...): a
  build on another node would look the same, so it is removed only once it is older than
  any build (:data:`STALE_AFTER_S`); until then the run is told what it may wait on.
- where ``/proc`` cannot say who holds a file (not Linux): reported once older than
  :data:`STALE_AFTER_S`, with the command that clears it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

STALE_AFTER_S = 600.0  # ten builds' time: no build in progress holds a lock this long

# Filesystems that only this machine writes to. Any other type may be shared between nodes.
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "ramfs", "overlay", "apfs"}
)

_PROC = Path("/proc")


@dataclass(frozen=True)
class BuildLock:
    """One op's build lock and what is known of it."""

    path: Path
    age_s: float
    holders: tuple[int, ...] | None  # pids on this machine with the lock open; None: cannot tell
    filesystem: str  # the type of the filesystem the lock lies on ("" when unknown)

    @property
    def op(self) -> str:
        return self.path.parent.name

    @property
    def shared(self) -> bool:
        """Whether another node might be building behind this lock."""
        return self.filesystem not in LOCAL_FILESYSTEMS


def extensions_root() -> Path:
    """Where torch builds extensions: ``TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "torch_extensions"


def processes_holding(path: Path, proc: Path = _PROC) -> tuple[int, ...] | None:
    """The pids on this machine that have ``path`` open, or None where ``proc`` cannot tell.

    Reads ``/proc/<pid>/fd``; processes this user may not inspect are skipped (a lock under
    the user's own cache is held by the user's own processes).
    """
    if not (proc / "self" / "fd").is_dir():
        return None
    target = os.path.realpath(path)
    holders = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(entry / "fd" / fd) == target:
                    holders.append(int(entry.name))
                    break
            except OSError:
                continue
    return tuple(holders)


def _unescape_mount(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash in octal (``\\040``)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_type(path: Path, mounts: Path = _PROC / "mounts") -> str:
    """The type of the filesystem ``path`` lies on (its longest mount point), or "" when unknown."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return ""
    target = os.path.realpath(path)
    best, best_type = "", ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape_mount(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, fields[2]
    return best_type


def find_build_locks(root: Path | None = None, *, now: float | None = None) -> list[BuildLock]:
    """Every build lock under ``root`` (default: :func:`extensions_root`), with its age and holders."""
    root = extensions_root() if root is None else root
    now = time.time() if now is None else now
    found = []
    for lock in sorted(root.glob("*/*/lock")):  # <python and device>/<op>/lock
        try:
            age = now - lock.stat().st_mtime
        except FileNotFoundError:  # the build finished while we looked
            continue
        found.append(BuildLock(lock, age, processes_holding(lock), filesystem_type(lock)))
    return found


def _is_abandoned(lock: BuildLock) -> bool:
    """No build can be behind it: nobody here holds it, and nobody elsewhere could (or it is too old)."""
    if lock.holders is None or lock.holders:
        return False
    return not lock.shared or lock.age_s > STALE_AFTER_S


def clear_stale_build_locks(root: Path | None = None) -> list[str]:
    """Remove the locks no build holds; one line for each lock removed or left in the run's way."""
    lines = []
    for lock in find_build_locks(root):
        minutes = f"{lock.age_s / 60:.0f} min old"
        if _is_abandoned(lock):
            try:
                lock.path.unlink()
            except FileNotFoundError:  # its build ended while we looked
                continue
            lines.append(
                f"removed {lock.path} ({minutes}): {lock.op}'s build lock, left by a build that ended "
                "without removing it (no process holds it); the op is built again when a run needs it"
            )
        elif lock.holders:
            if lock.age_s > STALE_AFTER_S:
                lines.append(
                    f"{lock.path} ({minutes}) is held by pid {', '.join(map(str, lock.holders))}, "
                    f"still building {lock.op}; the ranks wait for that build to end"
                )
        elif lock.holders is None:
            if lock.age_s > STALE_AFTER_S:
                lines.append(
                    f"{lock.path} ({minutes}) is {lock.op}'s build lock, likely left by a build that ended "
                    f"without removing it; the ranks will wait on it with no output. If no run is "
                    f"building that op now: rm {lock.path}"
                )
        else:  # shared filesystem, young: another node may be building
            lines.append(
                f"{lock.path} ({minutes}, on {lock.filesystem or 'an unknown filesystem'}) is {lock.op}'s "
                "build lock, held by no process on this machine: another node may be building it. "
                f"If no run is building that op now: rm {lock.path}"
            )
    return lines


__all__ = [
    "STALE_AFTER_S",
    "BuildLock",
    "clear_stale_build_locks",
    "extensions_root",
    "filesystem_type",
    "find_build_locks",
    "processes_holding",
]
