"""``summary.json``: the run's status, layout, parameter count and final metrics, written atomically.

A run whose filesystem is full cannot write a new file beside summary.json, so its end would stay
``running``: then the end is written over the old file's own bytes instead, compact, the whole
summary when it fits and the status and error alone when it does not.
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary.json"
# What a run's end records when the full summary cannot be written for want of room.
ESSENTIAL_FIELDS = ("status", "error", "failed_rank", "steps_completed")
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def _strict(value: Any) -> Any:
    """NaN and inf are not JSON (a browser's or jq's parser rejects them): they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(item) for item in value]
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    """Write strict JSON to a temporary file beside ``path``, then rename: readers never see half a file."""
    data = _strict(data)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, default=str, allow_nan=False)
            handle.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary, or an empty dict when none was written."""
    path = run_dir / SUMMARY_FILE
    if not path.exists():
        return {}
    with path.open() as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def overwrite_in_place(path: Path, data: Any) -> bool:
    """Write ``data`` as compact JSON over ``path``'s own bytes, padded with spaces to its old
    length, when it fits in the space the file holds already (no new block: a full filesystem
    allows it). Not atomic: the last resort of a full disk. Returns whether it was written."""
    text = json.dumps(_strict(data), separators=(",", ":"), default=str, allow_nan=False) + "\n"
    encoded = text.encode()
    try:
        held = path.stat()
    except FileNotFoundError:
        return False
    room = max(held.st_size, held.st_blocks * 512)  # a file's last block is held whole
    if len(encoded) > room:
        return False
    padded = encoded + b" " * (held.st_size - len(encoded))  # trailing spaces are valid JSON
    with path.open("r+b") as handle:
        handle.write(padded)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def update_summary(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into summary.json (created if absent) and return the result.

    With no room for a new file, the result is written over the old one (the status and error
    alone when the whole does not fit there); with no room for that either, the error is raised."""
    path = run_dir / SUMMARY_FILE
    summary = read_summary(run_dir)
    before = dict(summary)
    summary.update(fields)
    try:
        write_json_atomic(path, summary)
    except OSError as error:
        if error.errno not in NO_ROOM:
            raise
        essential = {key: summary[key] for key in ESSENTIAL_FIELDS if key in summary}
        cut = {
            **before,
            **essential,
            "summary_cut": f"the filesystem was full ({error.strerror}): only the run's status was recorded",
        }
        if not (overwrite_in_place(path, summary) or overwrite_in_place(path, cut)):
            raise
    return summary
