"""Stale locks of torch's extension builds, which make a run wait forever without a word.

DeepSpeed builds some of its ops the first time a run needs them (the CPU collectives'
shared-memory op, DeepSpeedCPUAdam for offload), through ``torch.utils.cpp_extension``.
A build holds a ``lock`` file in the op's build folder and removes it when done; a run
killed during the build leaves the file behind, and every later run that needs the op
waits on it with no output. A build takes about a minute, so a lock much older than
that is reported before the ranks start, with the command that clears it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

STALE_AFTER_S = 600.0  # ten builds' time: no build in progress holds a lock this long


def extensions_root() -> Path:
    """Where torch builds extensions: ``TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "torch_extensions"


def stale_build_locks(root: Path | None = None, *, now: float | None = None) -> list[Path]:
    """The build locks under ``root`` older than :data:`STALE_AFTER_S`."""
    root = extensions_root() if root is None else root
    now = time.time() if now is None else now
    stale = []
    for lock in sorted(root.glob("*/*/lock")):  # <python and device>/<op>/lock
        try:
            age = now - lock.stat().st_mtime
        except FileNotFoundError:  # the build finished while we looked
            continue
        if age > STALE_AFTER_S:
            stale.append(lock)
    return stale


def stale_lock_warnings(root: Path | None = None) -> list[str]:
    """One line per stale lock: what it blocks and how to clear it."""
    return [
        f"{lock} is {lock.parent.name}'s build lock, left by a build that ended without removing it; "
        f"the ranks will wait on it with no output. If no other run is building that op now: rm {lock}"
        for lock in stale_build_locks(root)
    ]
