"""bench/gpu_check.sh refuses, before it runs or writes anything, what would waste a GPU's time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.sh"


def _check(
    out: Path, python: str, *, budget: str | None = None, parts: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": python}
    if budget is not None:
        env["GPU_CHECK_BUDGET_S"] = budget
    if parts is not None:
        env["GPU_CHECK_PARTS"] = parts
    return subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env)


def test_an_interpreter_without_ladders_requirements_is_refused_with_the_fix(tmp_path):
    bare = tmp_path / "python"  # this interpreter without its site-packages: torch, deepspeed, ... missing
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    out = tmp_path / "check"
    result = _check(out, str(bare))
    assert result.returncode == 2
    assert f"{bare} cannot run ladder: ModuleNotFoundError: No module named 'deepspeed'" in result.stderr
    assert "scripts/offline_wheels.py" in result.stderr
    assert not out.exists()


def test_a_folder_holding_an_earlier_check_is_left_as_it_is(tmp_path):
    out = tmp_path / "check"
    out.mkdir()
    (out / "results.json").write_text("{}")
    result = _check(out, sys.executable)
    assert result.returncode == 2 and "already holds an earlier check's results" in result.stderr
    assert [path.name for path in out.iterdir()] == ["results.json"]


def test_a_budget_that_is_not_seconds_is_refused_with_the_fix(tmp_path):
    out = tmp_path / "check"
    result = _check(out, sys.executable, budget="8m")
    assert result.returncode == 2
    assert "GPU_CHECK_BUDGET_S=8m is not a whole number of seconds" in result.stderr
    assert not out.exists()


def test_a_spent_budget_skips_every_part_and_still_writes_the_table(tmp_path):
    out = tmp_path / "check"
    result = _check(out, sys.executable, budget="0")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "run_ddp skipped: " in result.stderr
    results = json.loads((out / "results.json").read_text())
    assert {row["status"] for row in results["rows"]} == {"missing"}
    assert {part["exit_status"] for part in results["timings"]} == {"skipped"}


def test_a_part_it_does_not_have_is_refused_with_the_parts_it_has(tmp_path):
    out = tmp_path / "check"
    result = _check(out, sys.executable, parts="peer,speed")
    assert result.returncode == 2
    assert "GPU_CHECK_PARTS names no part 'speed'" in result.stderr
    assert "tests, layouts, largest, compiled, peer, calibrate, recommend, zero3_micro1" in result.stderr
    assert not out.exists()


def test_the_parts_asked_for_run_and_no_others(tmp_path):
    """GPU_CHECK_PARTS=compiled with a spent budget: only the compiled run's parts are timed."""
    out = tmp_path / "check"
    result = _check(out, sys.executable, budget="0", parts="compiled")
    assert result.returncode == 0, result.stderr[-2000:]
    timed = [part["part"] for part in json.loads((out / "results.json").read_text())["timings"]]
    assert timed == ["run_zero1_compiled", "plan_zero1_compiled"]


def test_the_timemodel_part_records_the_figures_and_steps_the_time_model_needs(tmp_path):
    """GPU_CHECK_PARTS=timemodel in reduced mode (no CUDA here; about 40 s on 2 cores): the
    device's calibration with ZeRO-3's hooks and gather figures and each figure's source, three
    tiny runs, and their measured steps beside the predictions, the all-persistent ZeRO-3 run
    paying the hooks."""
    out = tmp_path / "check"
    result = _check(out, sys.executable, parts="timemodel")
    assert result.returncode == 0, result.stderr[-2000:]
    timings = json.loads((out / "results.json").read_text())["timings"]
    assert [(part["part"], part["exit_status"]) for part in timings] == [
        ("calibrate", 0),
        ("run_tm_eager", 0),
        ("run_tm_zero3", 0),
        ("run_tm_zero3_persistent", 0),
    ]
    calibration = json.loads((out / "calibration.json").read_text())
    # measured figures: their size is the host's (a busy one may read a difference as 0), not their presence
    assert calibration["zero3_hook_s"] >= 0 and calibration["zero3_gather_s"] is not None
    assert "zero3_overhead.py" in calibration["sources"]["zero3_hook_s"]
    rows = {row["label"]: row for row in json.loads((out / "time_model.json").read_text())}
    assert set(rows) == {"eager", "zero3", "zero3_persistent"}
    assert all(row["measured_s"] > 0 and row["predicted_s"] > 0 for row in rows.values())
    assert rows["zero3_persistent"]["hook_x"] > 0 and rows["eager"]["hook_x"] == 0
    assert (out / "time_model.txt").read_text().splitlines()[-1].startswith("median_abs_err=")
