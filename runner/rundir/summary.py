"""``summary.json``: the run's status, layout, parameter count and final metrics, written atomically.

A run whose filesystem is full cannot write a new file beside summary.json, so its end would stay
``running``: then the end is written over the old file's own bytes instead, compact, the whole
summary when it fits and the status and error alone when it does not.

Its schema is ``RunSummary``: the outcome's fields typed, the measured records (memory, speed,
wall time, ...) kept as their writers made them. ``schema`` names the version; a summary written
before it had one (version 0) is read and upgraded. Who writes it, one writer per phase:
launchers/run_record.py (prelaunch), runner/train/record.py (rank 0 at the attempt's end) and
runner/rundir/outcome.py (the status, whoever decides it).
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary.json"
SCHEMA_VERSION = 1
STATUSES = ("running", "completed", "failed", "interrupted")
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


class SummaryError(ValueError):
    """A summary.json that is not JSON or holds a key of the wrong type."""


@dataclass(frozen=True)
class RunSummary:
    """summary.json, typed: the run's outcome, and every other record as its writer made it."""

    schema: int = SCHEMA_VERSION
    status: str | None = None  # one of STATUSES; None before prelaunch wrote "running"
    error: str | None = None  # why the run did not complete, in words
    failed_rank: int | None = None  # the rank whose failure is the cause
    steps_completed: int | None = None
    records: dict[str, Any] = field(default_factory=dict)  # layout, memory, wall_time, ...

    def to_dict(self) -> dict[str, Any]:
        """The JSON object summary.json holds (absent outcome fields stay absent)."""
        outcome = {
            "status": self.status,
            "error": self.error,
            "failed_rank": self.failed_rank,
            "steps_completed": self.steps_completed,
        }
        return {"schema": self.schema, **self.records, **{k: v for k, v in outcome.items() if v is not None}}


# Each typed key, the types it may hold, and the words a reader is told when it holds another.
_TYPED: dict[str, tuple[tuple[type, ...], str]] = {
    "schema": ((int,), "an integer version"),
    "status": ((str,), f"one of {', '.join(STATUSES)}"),
    "error": ((str,), "a string or null"),
    "failed_rank": ((int,), "an integer rank or null"),
    "steps_completed": ((int,), "an integer or null"),
}


def _fix(path: Path) -> str:
    """What a reader does about a malformed summary."""
    return f"move {path} aside (the run's other files stay readable) or rerun the cell"


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A summary of an older schema as the current one reads it (version 0: no ``schema`` key,
    the same keys otherwise)."""
    return {**data, "schema": SCHEMA_VERSION} if "schema" not in data else data


def parse_summary(data: Any, path: Path) -> RunSummary:
    """``data`` (summary.json's JSON) as a RunSummary, upgraded; SummaryError names the file,
    the key and the fix when it is not one."""
    fix = _fix(path)
    if not isinstance(data, dict):
        raise SummaryError(f"{path}: holds {type(data).__name__}, not a JSON object; {fix}")
    data = _upgrade(data)
    for key, (types, words) in _TYPED.items():
        value = data.get(key)
        wrong = isinstance(value, bool) or not isinstance(value, types)
        if value is not None and wrong:
            raise SummaryError(f"{path}: key {key!r} is {value!r}, expected {words}; {fix}")
    status = data.get("status")
    if status is not None and status not in STATUSES:
        raise SummaryError(
            f"{path}: key 'status' is {status!r}, expected one of {', '.join(STATUSES)}; {fix}"
        )
    if data["schema"] > SCHEMA_VERSION:
        raise SummaryError(
            f"{path}: key 'schema' is {data['schema']}, newer than this ladder reads ({SCHEMA_VERSION}); "
            "upgrade ladder to read it"
        )
    return RunSummary(
        schema=data["schema"],
        status=status,
        error=data.get("error"),
        failed_rank=data.get("failed_rank"),
        steps_completed=data.get("steps_completed"),
        records={k: v for k, v in data.items() if k not in _TYPED},
    )


def load_summary(run_dir: Path) -> RunSummary | None:
    """The run's summary through the schema (None when none was written); SummaryError when
    summary.json is not JSON or holds a wrongly typed key."""
    path = run_dir / SUMMARY_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as error:
        raise SummaryError(f"{path}: not JSON ({error}); {_fix(path)}") from error
    return parse_summary(data, path)


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
    if not before:  # a new summary names its schema; an older run's keeps its own (read: _upgrade)
        summary = {"schema": SCHEMA_VERSION, **summary}
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
