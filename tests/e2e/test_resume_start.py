"""A resume that finds no checkpoint says so before it trains; ``train.resume=required`` refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import run_train

pytestmark = pytest.mark.e2e

RUN = "08-29-03.368831"  # a run that saved a checkpoint
TYPO = "08-29-03.36883"  # the same name, one digit dropped


def _saved_run(outputs: Path) -> Path:
    """A run directory holding a complete checkpoint's record, as runner/rundir/checkpoint_record.py
    reads it (``checkpoints/latest.json`` naming a folder that exists)."""
    run = outputs / "2026-12-05" / RUN
    (run / "checkpoints" / "step_00000004").mkdir(parents=True)
    (run / "checkpoints" / "latest.json").write_text(
        json.dumps({"tag": "step_00000004", "completed_steps": 4})
    )
    (outputs / "2026-12-05" / "07-00-00.000001").mkdir()  # a run with no checkpoint: not named
    return run


def test_required_refuses_a_directory_with_no_checkpoint_and_names_the_run_near_it(tmp_path):
    run_dir = _saved_run(tmp_path / "outputs").parent / TYPO
    result = run_train("train.resume=required", "logger=none", run_dir=run_dir)
    assert result.returncode == 2, result.stderr[-2000:]
    said = result.stderr
    assert "refused before launch" in said
    assert f"train.resume=required: no checkpoint in {TYPO}, nothing to resume" in said
    assert f"hydra.run.dir={RUN}" in said and "train.resume=auto" in said  # the fixes
    assert "07-00-00.000001" not in said
    assert not run_dir.exists()  # nothing left behind


def test_auto_says_on_its_first_line_that_it_starts_at_step_0(tmp_path):
    run_dir = _saved_run(tmp_path / "outputs").parent / TYPO
    result = run_train("train.resume=auto", "train.steps=1", "data=synthetic", "logger=none", run_dir=run_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    first = next(line for line in (result.stdout + result.stderr).splitlines() if line.strip())
    assert f"no checkpoint in {TYPO}: starting at step 0" in first, first
    assert f"run directories near it with checkpoints: {RUN}" in first
    assert json.loads((run_dir / "summary.json").read_text())["steps_completed"] == 1
