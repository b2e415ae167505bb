"""A run's room on disk: the bytes a folder holds, and a full filesystem told from other errors, said with
the free space.

A run writes as it trains (metrics.jsonl, attempts.jsonl, checkpoints, summary.json). When the
filesystem fills (another program, a quota) the write fails with ENOSPC or EDQUOT, and every
write after it too, the records of the failure included: what failed is then said in words
that name the folder, its free space and the checkpoint the run continues from.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from runner.rundir.checkpoint_record import latest

NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def out_of_room(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from or while handling, is a write that found
    no room (ENOSPC, EDQUOT)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in NO_ROOM:
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def free_words(folder: Path) -> str:
    """``the filesystem of <folder> has 0.012 GB free``."""
    return f"the filesystem of {folder} has {shutil.disk_usage(folder).free / 1e9:.3f} GB free"


def continue_words(run_dir: Path, *, needs_room: bool = True) -> str:
    """How the run goes on (``needs_room``: once there is room again)."""
    record = latest(run_dir)
    if record is None:
        return "the run has no checkpoint to continue from"
    return f"train.resume=auto continues the run from {record['tag']}" + (
        " once there is room" if needs_room else ""
    )


def no_room_words(error: BaseException, run_dir: Path) -> str:
    """``OSError: [Errno 28] No space left on device`` with the free space and how to go on."""
    return f"{type(error).__name__}: {error} ({free_words(run_dir)}; {continue_words(run_dir)})"


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder`` (a saved checkpoint), a file under two names
    (a hard link) once; links to other folders (a pipeline's view) not at all."""
    sizes: dict[tuple[int, int], int] = {}
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            held = path.stat()
            sizes[(held.st_dev, held.st_ino)] = held.st_size
    return sum(sizes.values())


__all__ = ["NO_ROOM", "continue_words", "folder_bytes", "free_words", "no_room_words", "out_of_room"]
