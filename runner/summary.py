"""``summary.json``: the run's status, layout, parameter count and final metrics, written atomically."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary.json"


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


def update_summary(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into summary.json (created if absent) and return the result."""
    summary = read_summary(run_dir)
    summary.update(fields)
    write_json_atomic(run_dir / SUMMARY_FILE, summary)
    return summary
