"""A sweep on this host: every cell checked before the first trains; a failed cell stops no other."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from train_helpers import ROOT, clean_env, injecting

pytestmark = pytest.mark.e2e


def _at(sweep_dir):
    return f"hydra.sweep.dir={sweep_dir}"


def _sweep(sweep_dir, *overrides, env=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", "logger=none", *overrides, _at(sweep_dir)],
        cwd=sweep_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(env),
    )


def test_a_bad_cell_refuses_the_sweep_before_any_cell_trains(tmp_path):
    """Cells #0 and #1 could run; #2 cannot split its batch, #3 has more stages than blocks: refused
    before #0 starts (it used to train #0 and #1 first), each problem with the cells it concerns."""
    sweep_dir = tmp_path / "sweep"
    proc = _sweep(sweep_dir, "gpus=1,2", "parallel=ddp,pp2", "model.n_layer=1", "batch.global_size=3")
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = proc.stderr
    assert "refused before launch; no cell was started" in said
    assert "parallel.pp=2 > model.n_layer=1" in said and "cells: #1 (gpus=1 parallel=pp2), #3" in said
    assert "batch.global_size=3 cannot be split over dp=2" in said
    assert "cells: #2 (gpus=2 parallel=ddp)" in said
    assert "Traceback" not in said
    assert not sweep_dir.exists()  # the directory Hydra made for the sweep (its multirun.yaml) is gone


def test_a_failed_cell_is_named_and_the_cells_after_it_still_run(tmp_path):
    """Rank 1 of the 2-rank cell fails; the 1-rank cell after it trains all the same; the sweep
    ends naming the failed cell, with a table of both, and exits 1."""
    sweep_dir = tmp_path / "sweep"
    began = time.time()
    proc = _sweep(
        sweep_dir, "gpus=2,1", "train.steps=2", "data.seq_len=32", env=injecting(LADDER_INJECT_FAULT="1:1")
    )
    elapsed = time.time() - began
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed = json.loads((sweep_dir / "0" / "summary.json").read_text())
    completed = json.loads((sweep_dir / "1" / "summary.json").read_text())
    assert (failed["status"], completed["status"]) == ("failed", "completed")
    # Each cell's clock starts when the cell starts: the cells' wall times add up to no more than the
    # whole command's (the second cell's used to include all of the first's).
    walls = [cell["wall_time"]["total_s"] for cell in (failed, completed)]
    assert sum(walls) <= elapsed, (walls, elapsed)
    named = "ladder: 1 of 2 cells failed:\n  #0 (gpus=2): rank 1 failed: RuntimeError: fault injected"
    assert named in proc.stderr
    assert f"ladder report {sweep_dir}" in proc.stderr
    assert "HYDRA_FULL_ERROR" not in proc.stderr
    # The sweep ends on one table of its cells, in job order, and the command that compares them.
    out = proc.stdout
    assert f"sweep {sweep_dir}: 1 of 2 cells completed" in out
    cells = [line.split()[:3] for line in out.split("1 of 2 cells completed", 1)[1].splitlines()]
    assert [c for c in cells if c[:1] in (["0"], ["1"])] == [
        ["0", "gpus=2", "failed"],
        ["1", "gpus=1", "completed"],
    ]
    assert out.rstrip().endswith(
        f"compare the cells: ladder report {sweep_dir}  (--html report.html for charts)"
    )
