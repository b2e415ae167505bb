"""Which checkpoint a run directory holds, read without torch: ``checkpoints/latest.json``.

The launching process asks this before it decides anything (is there a run to continue,
is it finished?); runner/checkpoint/save.py writes the record and runner/checkpoint/restore.py
loads the checkpoint. The names of ``checkpoints/``'s entries and ``latest.json``'s marks are
kept here, for both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.rundir.run_files import CHECKPOINT_DIR, LATEST_FILE

UNIVERSAL_SUFFIX = "_universal"  # a checkpoint converted for another layout: <tag>_universal*
PARTIAL_PREFIX = ".partial-"  # a save or a conversion in progress: .partial-<tag>, never loaded
# latest.json's mark of a tp x pp checkpoint whose model-states files hold every stage's
# splits (runner/checkpoint/tp_splits.py); one without it resumes on its own layout only.
STAGE_SPLITS = "every_stages_splits_recorded"


def tag_for(completed_steps: int) -> str:
    """Directory name of the checkpoint taken after ``completed_steps`` optimizer steps."""
    return f"step_{completed_steps:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints under ``root`` (``<run_dir>/checkpoints``), oldest first: not a
    save in progress (``.partial-*``), not a universal conversion of one."""
    return sorted(p for p in root.glob("step_*") if p.is_dir() and UNIVERSAL_SUFFIX not in p.name)


def latest(run_dir: Path) -> dict[str, Any] | None:
    """The newest complete checkpoint's record, or None."""
    path = run_dir / CHECKPOINT_DIR / LATEST_FILE
    if not path.exists():
        return None
    record: dict[str, Any] = json.loads(path.read_text())
    if not (run_dir / CHECKPOINT_DIR / record["tag"]).is_dir():
        return None
    return record


def own_layout(record: dict[str, Any]) -> str:
    """``gpus=2 parallel.tp=2 parallel.zero_stage=1``: the overrides that resume ``record`` unmoved."""
    saved = record["layout"]
    split = [f"parallel.{key}={saved.get(key, 1)}" for key in ("tp", "pp") if saved.get(key, 1) > 1]
    return " ".join([f"gpus={saved['gpus']}", *split, f"parallel.zero_stage={record['zero_stage']}"])
