"""A resumed sweep leaves each cell's Hydra files as the latest attempt that ran left them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from train_helpers import ROOT, clean_env, earlier_sweep, file_digests

pytestmark = pytest.mark.e2e


def _resume_sweep(sweep_dir, *overrides):
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "-m",
            "train.resume=auto",
            "logger=none",
            "data=synthetic",
            *overrides,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=sweep_dir.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
    )


def test_a_refused_sweep_resume_leaves_every_file_as_it_was(tmp_path):
    sweep_dir = tmp_path / "sweep"
    earlier_sweep(sweep_dir, ["0", "1"])
    before = file_digests(sweep_dir)
    # Hydra writes cell 0's files, then ladder refuses the cell: the sweep stops there.
    proc = _resume_sweep(sweep_dir, "train.steps=0")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "train.steps=0" in proc.stderr
    assert file_digests(sweep_dir) == before  # cell 0 put back, cell 1 and multirun.yaml untouched


def test_a_sweep_resume_keeps_the_files_of_the_cells_that_ran(tmp_path):
    sweep_dir = tmp_path / "sweep"
    earlier_sweep(sweep_dir, ["0", "1", "2"])
    # Cell 1 holds a checkpoint of another experiment (global batch 32): its resume is refused
    # when the cell starts, which only its own directory can tell.
    tag = sweep_dir / "1" / "checkpoints" / "step_00000001"
    tag.mkdir(parents=True)
    layout = {"gpus": 1, "dp": 1, "tp": 1, "pp": 1, "micro_size": 16, "accum_steps": 2, "global_size": 32}
    record = {"tag": tag.name, "completed_steps": 1, "layout": layout, "zero_stage": 0, "precision": "fp32"}
    (tag.parent / "latest.json").write_text(json.dumps(record))
    before = file_digests(sweep_dir)
    # Cell 0 trains (nothing to resume from: it starts afresh), cell 1 is refused, and cell 2 is
    # not reached.
    proc = _resume_sweep(sweep_dir, "seed=0,1,2", "train.steps=2")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "global_size" in proc.stderr and "different experiment" in proc.stderr
    after = file_digests(sweep_dir)
    assert "steps: 2" in (sweep_dir / "0/.hydra/config.yaml").read_text()
    assert after["0/.hydra/config.yaml"] != before["0/.hydra/config.yaml"]
    assert after["multirun.yaml"] != before["multirun.yaml"]  # a cell of this attempt ran
    for cell in ("1", "2"):
        assert {k: v for k, v in after.items() if k.startswith(f"{cell}/")} == {
            k: v for k, v in before.items() if k.startswith(f"{cell}/")
        }
    assert not [path for path in sweep_dir.rglob(".before-this-attempt")]


def test_a_finished_sweep_resumed_trains_nothing_and_changes_nothing(tmp_path):
    """Each finished cell says so and launches no rank; the sweep's files stay as they were."""
    sweep_dir = tmp_path / "sweep"
    first = _resume_sweep(sweep_dir, "parallel=ddp,zero1", "train.steps=2", "data.seq_len=32")
    assert first.returncode == 0, first.stderr[-2000:]
    before = file_digests(sweep_dir)
    again = _resume_sweep(sweep_dir, "parallel=ddp,zero1", "train.steps=2", "data.seq_len=32")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("the run completed 2 steps already (train.steps=2): nothing to train") == 2
    assert "layout: gpus" not in again.stderr + again.stdout  # no layout resolved, no rank started
    after = file_digests(sweep_dir)
    # Hydra appends each cell's log; every other file, the summaries and .hydra/ included, is as it was.
    assert {k: v for k, v in after.items() if not k.endswith("train.log")} == {
        k: v for k, v in before.items() if not k.endswith("train.log")
    }
