"""A run directory on a small filesystem (a tmpfs): refused before launch when its checkpoints
cannot fit; a save that runs out of room mid-run is removed and the run ends saying so, with the
checkpoint before it intact, and continues once there is room.

Mounting needs root (as the SLURM tier does); elsewhere these tests skip.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import ROOT, clean_env, compose_config, file_digests, run_train, start_train

from runner.checkpoint.size import config_checkpoint_bytes

pytestmark = pytest.mark.multirank

# tiny, fp32, ddp on 1 rank: a checkpoint of 38.8 MB.
RUN = ["logger=none", "batch.global_size=8", "batch.micro_size=8", "data.seq_len=64"]
MB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of ``size`` MiB under tmp_path; unmounted after the test."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(size_mb: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _wait_for(path: Path, proc: subprocess.Popen[bytes], *, lines: int = 0) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if path.exists() and (not lines or len(path.read_text().splitlines()) >= lines):
            return
        assert proc.poll() is None, f"the run ended before {path.name} appeared"
        time.sleep(0.02)
    raise AssertionError(f"no {path} in 300 s")


def test_checkpoints_that_cannot_fit_are_refused_before_launch(small_disk):
    disk = small_disk(100)
    each = config_checkpoint_bytes(compose_config(*RUN))
    assert 2 * each < 100 * MB < 3 * each  # 2 fit, 3 do not
    refused = run_train(*RUN, "train.steps=6", "train.checkpoint_every=2", run_dir=disk / "run")
    assert refused.returncode != 0
    for words in ("train.checkpoint_every=2", f"3 x {each / 1e9:.3f} GB", "train.keep_checkpoints=1 needs"):
        assert words in refused.stderr, refused.stderr[-2000:]
    assert not (disk / "run" / "metrics.jsonl").exists()  # no rank started
    # The fix it names runs.
    kept_one = run_train(
        *RUN, "train.steps=6", "train.checkpoint_every=2", "train.keep_checkpoints=1", run_dir=disk / "run"
    )
    assert kept_one.returncode == 0, kept_one.stderr[-3000:]
    assert [p.name for p in (disk / "run" / "checkpoints").glob("step_*")] == ["step_00000006"]


def test_a_move_whose_conversion_cannot_fit_is_refused_before_anything_is_written(small_disk):
    """ddp's 38.8 MB checkpoint converted for ZeRO-1: 51.9 MB of universal copy beside it, on a
    disk with about 41 MB left; on its own layout the run needs no copy and continues."""
    disk = small_disk(80)
    run_dir = disk / "run"
    saving = ["train.checkpoint_every=2", "train.keep_checkpoints=1"]
    first = run_train(*RUN, "train.steps=2", *saving, run_dir=run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    before = file_digests(run_dir / "checkpoints")
    move = [*RUN, "parallel=zero1", "train.steps=4", *saving, "train.resume=auto"]
    planned = run_train(*move, "plan=true", "cluster.storage_gb_per_s=0.5", run_dir=run_dir)
    assert planned.returncode == 3, planned.stderr[-3000:]  # the plan's verdict: the move does not fit
    for said in (  # plan=true weighs the move as the run does
        "train.resume=auto: continues step_00000002 (2 steps done, 0.039 GB), saved on gpus=1 "
        "parallel.zero_stage=0",
        "this layout converts it first, before its ranks load it: 0.052 GB of copies beside it; at "
        "least 0.182 s at cluster.storage_gb_per_s=0.5",
        "0.052 GB of step_00000002 converted for this layout",
        "=> DOES NOT FIT",
    ):
        assert said in planned.stdout, (said, planned.stdout[-3000:])
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["resume"]["from"] == "step_00000002" and plan["resume"]["refused"] is None
    conversion = plan["checkpoint_disk"]["conversion"]
    assert conversion["tag"] == "step_00000002" and conversion["bytes"] == conversion["peak_bytes"]
    assert file_digests(run_dir / "checkpoints") == before
    moved = run_train(*move, run_dir=run_dir)
    assert moved.returncode != 0
    said = "train.resume=auto: moving step_00000002 to this layout writes a converted copy beside it"
    assert said in moved.stderr, moved.stderr[-3000:]
    assert "resume on the checkpoint's own layout (gpus=1 parallel.zero_stage=0)" in moved.stderr
    assert file_digests(run_dir / "checkpoints") == before  # nothing converted, nothing half-written
    same = run_train(*RUN, "train.steps=4", *saving, "train.resume=auto", run_dir=run_dir)
    assert same.returncode == 0, same.stderr[-3000:]
    assert same.summary["resumed_from_step"] == 2


def test_a_save_that_runs_out_of_room_is_removed_and_the_run_continues_once_there_is_room(small_disk):
    disk = small_disk(100)
    run_dir = disk / "run"
    args = [*RUN, "train.steps=12", "train.checkpoint_every=4", "train.keep_checkpoints=1"]
    stderr = disk.parent / "stderr.txt"
    proc = start_train(run_dir, *args, stderr=stderr)
    _wait_for(run_dir / "checkpoints" / "step_00000004", proc)
    filler = disk / "filler"  # another program fills the disk: 16 MB stay free, less than a checkpoint
    filler.write_bytes(b"\0" * (shutil.disk_usage(disk).free - 16 * MB))
    assert proc.wait(timeout=300) == 1
    said = stderr.read_text()
    summary = json.loads((run_dir / "summary.json").read_text())  # recorded: the save's room came back
    assert summary["status"] == "failed"
    error = summary["error"]
    assert error.startswith("CheckpointWriteError: checkpoint step_00000008 was not written"), error
    assert "no room" in error and "train.resume=auto continues the run from step_00000004" in error
    assert error in said
    checkpoints = run_dir / "checkpoints"
    # no partial; DeepSpeed's pointer (latest) beside ladder's record
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "latest.json", "step_00000004"]
    assert (checkpoints / "latest").read_text() == "step_00000004"  # DeepSpeed's pointer names it too
    assert json.loads((checkpoints / "latest.json").read_text())["completed_steps"] == 4

    filler.unlink()
    resumed = run_train(*args, "train.resume=auto", run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.summary["resumed_from_step"] == 4 and resumed.summary["status"] == "completed"


def test_a_stop_whose_checkpoint_cannot_fit_is_warned_of_and_says_why_it_was_not_saved(small_disk):
    disk = small_disk(30)  # less than one checkpoint
    run_dir = disk / "run"
    stderr = disk.parent / "stderr.txt"
    proc = start_train(run_dir, *RUN, "train.steps=200", stderr=stderr)
    _wait_for(run_dir / "metrics.jsonl", proc, lines=2)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=300) == 75
    logged = (run_dir / "train.log").read_text()
    assert "the checkpoint a stop writes (Ctrl-C, SIGTERM, a SLURM time limit) would not fit" in logged
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["error"].startswith("stopped by SIGINT; rank 0 failed before a checkpoint was saved")
    assert "no room" in summary["error"] and "train.resume=auto starts it over" in summary["error"]
    assert list((run_dir / "checkpoints").iterdir()) == []  # the partial save is gone
    assert shutil.disk_usage(disk).free > 25 * MB


def test_a_sweep_whose_cells_checkpoints_cannot_all_fit_is_refused_before_its_first_cell(small_disk):
    disk = small_disk(100)  # each cell's 2 x 38.8 MB fits; what both keep, and a save beside, does not
    sweep = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "-m",
            "parallel=ddp,zero3",
            *RUN,
            "train.steps=4",
            "train.checkpoint_every=2",
            "train.keep_checkpoints=1",
            f"hydra.sweep.dir={disk / 'sweep'}",
        ],
        cwd=disk.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
    )
    assert sweep.returncode == 2, sweep.stderr[-3000:]
    assert "the sweep's 2 cells with train.checkpoint_every need 0.116 GB" in sweep.stderr
    assert "cells: all of them" in sweep.stderr
    assert not (disk / "sweep").exists()  # made for nothing, removed


def test_a_disk_that_fills_to_the_last_byte_ends_the_run_saying_so(small_disk):
    """The next write (a metrics line or a checkpoint) finds no room, and so does every new file
    that would record the failure: summary.json's end is written over its old bytes, and the run
    says why, where, with the free space and the checkpoint it continues from."""
    disk = small_disk(100)
    run_dir = disk / "run"
    stderr = disk.parent / "stderr.txt"
    saving = ["train.checkpoint_every=2", "train.keep_checkpoints=1"]
    proc = start_train(run_dir, *RUN, "train.steps=400", *saving, stderr=stderr)
    _wait_for(run_dir / "checkpoints" / "latest.json", proc)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * shutil.disk_usage(disk).free)  # nothing left
    assert proc.wait(timeout=300) == 1
    said = stderr.read_text()
    assert "ladder: rank 0 could not record its failure: [Errno 28] No space left on device" in said
    line = next(line for line in said.splitlines() if line.startswith("ladder: run failed: rank 0 failed:"))
    # The write that found no room: a checkpoint's, or a metrics line's (as the step falls).
    assert "no room: the checkpoint is about" in line or "No space left on device" in line
    assert f"the filesystem of {run_dir}" in line and "0.000 GB" in line
    assert "train.resume=auto continues the run from step_" in line and "once there is room" in line
    # No new file fits, so summary.json's end is written over its own bytes: not left `running`.
    ended = json.loads((run_dir / "summary.json").read_text())
    assert ended["status"] == "failed" and ended["error"] in line
    filler.unlink()
    resumed = run_train(*RUN, "train.steps=8", *saving, "train.resume=auto", run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.summary["status"] == "completed"
