"""Which checkpoint a run directory holds, read without torch: ``checkpoints/latest.json``.

The launching process asks this before it decides anything (is there a run to continue,
is it finished?); runner/checkpoint/save.py writes the record and runner/checkpoint/restore.py
loads the checkpoint. The names of ``checkpoints/``'s entries and ``latest.json``'s marks are
kept here, for both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, TypedDict

from runner.rundir.run_files import CHECKPOINT_DIR, LATEST_FILE

UNIVERSAL_SUFFIX = "_universal"  # a checkpoint converted for another layout: <tag>_universal*
PARTIAL_PREFIX = ".partial-"  # a save or a conversion in progress: .partial-<tag>, never loaded
# latest.json's mark of a tp x pp checkpoint whose model-states files hold every stage's
# splits (runner/checkpoint/tp_splits.py); one without it resumes on its own layout only.
STAGE_SPLITS: Final = "every_stages_splits_recorded"


class NoiseScaleState(TypedDict):
    """``noise_scale``: the gradient noise scale's EMAs and their count (runner/metrics/noise_scale.py
    ``NoiseScale.state``); an EMA that was not finite is null."""

    updates: int
    grad_sq: float | None
    trace_sigma: float | None


class LossScaleState(TypedDict):
    """``fp16_loss_scale``: fp16's dynamic loss scale and the steps it skipped
    (runner/engine/fixes/fp16_stage0_loss_scale.py ``OverflowLog.state``)."""

    cur_scale: float
    cur_iter: float
    last_overflow_iter: float
    overflow_steps: list[int]


class _CheckpointNamed(TypedDict):
    tag: str
    completed_steps: int
    layout: dict[str, int]  # runner/layout.py Layout.to_json
    zero_stage: int


class CheckpointRecord(_CheckpointNamed, total=False):
    """``latest.json``: the newest complete checkpoint, as runner/checkpoint/save.py writes it; the
    keys after ``zero_stage`` are absent from the records of earlier ladders (and the loss scale
    outside fp16, the stage splits outside tp x pp)."""

    precision: str
    skipped_steps: list[int]
    noise_scale: NoiseScaleState | None
    fp16_loss_scale: LossScaleState
    every_stages_splits_recorded: bool  # STAGE_SPLITS


def tag_for(completed_steps: int) -> str:
    """Directory name of the checkpoint taken after ``completed_steps`` optimizer steps."""
    return f"step_{completed_steps:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints under ``root`` (``<run_dir>/checkpoints``), oldest first: not a
    save in progress (``.partial-*``), not a universal conversion of one."""
    return sorted(p for p in root.glob("step_*") if p.is_dir() and UNIVERSAL_SUFFIX not in p.name)


def latest(run_dir: Path) -> CheckpointRecord | None:
    """The newest complete checkpoint's record, or None."""
    path = run_dir / CHECKPOINT_DIR / LATEST_FILE
    if not path.exists():
        return None
    record: CheckpointRecord = json.loads(path.read_text())
    if not (run_dir / CHECKPOINT_DIR / record["tag"]).is_dir():
        return None
    return record


def own_layout(record: CheckpointRecord) -> str:
    """``gpus=2 parallel.tp=2 parallel.zero_stage=1``: the overrides that resume ``record`` unmoved."""
    saved = record["layout"]
    split = [f"parallel.{key}={saved.get(key, 1)}" for key in ("tp", "pp") if saved.get(key, 1) > 1]
    return " ".join([f"gpus={saved['gpus']}", *split, f"parallel.zero_stage={record['zero_stage']}"])
