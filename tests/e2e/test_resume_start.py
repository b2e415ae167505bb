"""A resume that finds no checkpoint says so before it trains; ``train.resume=required`` refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import TrainResult, run_train

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


@pytest.fixture(scope="module")
def started_over(tmp_path_factory) -> TrainResult:
    """train.resume=auto in a mistyped directory beside a run that saved a checkpoint: one step."""
    run_dir = _saved_run(tmp_path_factory.mktemp("auto") / "outputs").parent / TYPO
    return run_train("train.resume=auto", "train.steps=1", "data=synthetic", "logger=none", run_dir=run_dir)


def test_auto_says_on_its_first_line_that_it_starts_at_step_0(started_over):
    assert started_over.returncode == 0, started_over.stderr[-2000:]
    said = started_over.stdout + started_over.stderr
    first = next(line for line in said.splitlines() if line.strip())
    assert f"no checkpoint in {TYPO}: starting at step 0" in first, first
    assert f"run directories near it with checkpoints: {RUN}" in first
    assert json.loads((started_over.run_dir / "summary.json").read_text())["steps_completed"] == 1


def test_deepspeeds_accelerator_guess_is_not_printed_and_the_runs_warnings_stay(started_over):
    said = started_over.stdout + started_over.stderr
    assert "Setting accelerator to CPU" not in said  # deepspeed/accelerator/real_accelerator.py
    assert "[ladder][WARNING] - no checkpoint in" in said  # a warning of the run's own, kept


def test_the_wall_time_runs_from_the_command_with_the_wait_before_the_ranks(started_over):
    wall = json.loads((started_over.run_dir / "summary.json").read_text())["wall_time"]
    assert wall["prelaunch_s"] > 0  # the launching process's composing, checking and planning
    assert "calibration_s" in wall and wall["measured"] == "rank 0, this attempt, from its command's start"
    line = next(line for line in started_over.stdout.splitlines() if line.startswith("wall time "))
    assert "prelaunch " in line
