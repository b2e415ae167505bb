"""Strict JSON written atomically: the writer of every JSON file ladder keeps (summary.json,
plan.json, a checkpoint's latest.json, the failure records, the CPU peaks' cache).

Strict: NaN and inf, which JSON lacks, become null, so a browser's or jq's parser reads every
file. Atomic: a temporary file beside the target, then a rename, so a reader never sees half
a file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def strict_json(value: Any) -> Any:
    """NaN and inf are not JSON (a browser's or jq's parser rejects them): they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(item) for item in value]
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    """Write strict JSON to a temporary file beside ``path``, then rename: readers never see half a file."""
    data = strict_json(data)
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
