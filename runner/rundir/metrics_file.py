"""``metrics.jsonl``, one JSON object per logged step: written, read and cut back here only.

:class:`JsonlSink` appends a rank 0's lines as the run trains (runner/metrics/sinks.py
builds it); :func:`read_records` reads them back (``ladder report``, the out-of-memory
diagnosis); :func:`truncate_metrics` drops the lines a resume logs again
(launchers/resume.py). Each line is written whole, so a killed run leaves at most a last
line cut short, which every reader skips.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from runner.rundir.run_files import METRICS_FILE


def metrics_path(run_dir: Path) -> Path:
    """The run directory's ``metrics.jsonl``."""
    return run_dir / METRICS_FILE


def _json_safe(value: Any) -> Any:
    """NaN and inf are not JSON: write them as strings so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonlSink:
    """``metrics.jsonl``: one JSON object per logged step, each written whole and flushed.

    Each line holds the step, when it was written (``timestamp``, seconds since the epoch:
    runner/metrics/goodput.py dates an attempt killed outright by it) and the step's metrics.

    One ``write`` per line on an unbuffered file: a process killed mid-run leaves
    complete lines only (the kernel holds what was written).
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one line."""
        record = {"step": step, "timestamp": time.time(), **{k: _json_safe(v) for k, v in metrics.items()}}
        os.write(self._fd, (json.dumps(record) + "\n").encode())

    def close(self, summary: dict[str, Any]) -> None:
        """Close the file."""
        os.close(self._fd)


def read_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The file's records, in order, and how many lines could not be read (a killed run can
    leave half a line); none when there is no file."""
    if not path.exists():
        return [], 0
    records = []
    bad = 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, bad


def truncate_metrics(path: Path, *, completed_steps: int) -> None:
    """Keep only the metric lines of steps the checkpoint covers (resumed steps are logged again)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] < completed_steps:
                kept.append(line)
        except (ValueError, KeyError):
            continue  # a line cut short by a kill: dropped
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)
