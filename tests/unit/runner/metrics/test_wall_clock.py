"""Where a run's wall time went (runner/metrics/wall_clock.py): parts that add up to the total.

The clock's own marks read a fake ``time.time`` that moves only when a test says (exact however
busy the host is); the process start is the kernel's, read for real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from fake_clock import FakeClock
from train_helpers import ROOT

from runner.metrics import wall_clock
from runner.metrics.wall_clock import (
    BeforeRanks,
    WallClock,
    describe,
    process_start,
    wall_parts,
)
from runner.rundir.disk_room import folder_bytes

pytestmark = pytest.mark.unit


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock(now=1_800_000_000.0)
    monkeypatch.setattr(wall_clock, "time", SimpleNamespace(time=fake))
    return fake


def test_the_parts_add_up_to_the_total_and_the_steps_share_is_theirs(clock):
    # A process that started 2 s ago, 0.5 s of which it waited for its peers to join it.
    wall_of = WallClock(started=clock.now - 2.0, process_group_s=0.5)
    wall_of.mark("launch")
    clock.sleep(0.02)
    wall_of.mark("build")
    wall_of.mark("engine")
    wall_of.mark("resume")
    wall_of.mark("setup")
    for _ in range(3):
        clock.sleep(0.03)
        wall_of.step(0.03)
    clock.sleep(0.01)
    wall_of.checkpoint(0.01, 50_000_000)
    wall = wall_of.summary()
    parts = (
        *("prelaunch", "calibration", "launch", "build", "engine", "resume", "setup"),
        *("steps", "checkpoint", "other"),
    )
    assert sum(wall[f"{part}_s"] for part in parts) == pytest.approx(wall["total_s"], rel=1e-6)
    assert wall["launch_s"] == pytest.approx(2.0) and wall["build_s"] == pytest.approx(0.02)
    assert (wall["steps"], wall["first_step_s"], wall["checkpoints"]) == (3, 0.03, 1)
    assert wall["checkpoint_gb_per_s"] == pytest.approx(5.0)
    assert wall["steps_share"] == pytest.approx(0.09 / wall["total_s"])
    line = describe(wall)
    assert line is not None and line.startswith(f"wall time {wall['total_s']:.1f} s: steps 0.1 s (")
    assert "checkpoints 1 x 0.01 s (0.05 GB, 5.00 GB/s)" in line
    assert "resume" not in line  # nothing was loaded
    # Joining the process group is a part of launch, named in it, not a part of its own.
    assert wall["process_group_s"] == 0.5 and "(0.5 s of it joining the process group)" in line
    assert "joining" not in (describe({**wall, "process_group_s": 0.01}) or "")  # a join without a wait
    assert describe(None) is None
    # An attempt's line carries the seconds, not the save rate, which no sum over attempts means.
    assert set(wall_parts(wall_of)) == {f"{part}_s" for part in parts} | {
        "total_s",
        "first_step_s",
        "eval_s",
        "process_group_s",
    }


def test_the_process_start_is_when_the_interpreter_began_not_up_to_a_second_before():
    """psutil's create_time is early by the fraction of a second Linux's boot time drops: a run's
    launch would count it. The start lies between the parent's call and the child's first line,
    within the kernel's clock tick (10 ms): a bound that holds however busy the machine is."""
    before = time.time()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; first = time.time()\n"
            "from runner.metrics.wall_clock import process_start; print(first, process_start())",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    first, started = map(float, child.stdout.split())
    assert before - 0.02 < started <= first, (before, first, started)


def test_the_process_start_is_the_kernels_and_a_checkpoints_bytes_are_its_files(tmp_path):
    assert 0 <= time.time() - process_start() < 24 * 3600
    (tmp_path / "step_00000004" / "sub").mkdir(parents=True)
    (tmp_path / "step_00000004" / "a.pt").write_bytes(b"x" * 100)
    (tmp_path / "step_00000004" / "sub" / "b.pt").write_bytes(b"y" * 23)
    assert folder_bytes(tmp_path / "step_00000004") == 123
    # A second name of the same file (a hard link) holds no more room; nor does a link elsewhere.
    os.link(tmp_path / "step_00000004" / "a.pt", tmp_path / "step_00000004" / "a_again.pt")
    (tmp_path / "step_00000004" / "view.pt").symlink_to(tmp_path / "step_00000004" / "sub" / "b.pt")
    assert folder_bytes(tmp_path / "step_00000004") == 123


def test_the_total_runs_from_the_command_with_its_calibration_a_part_of_its_own(clock):
    # python train.py started 10 s ago and calibrated for 4 s; it started this rank 2 s ago.
    now = clock.now
    rank_of_launcher = WallClock(started=now - 2.0, before=BeforeRanks(started=now - 10.0, calibration_s=4.0))
    rank_of_launcher.mark("launch")
    wall = rank_of_launcher.summary()
    assert wall["total_s"] == pytest.approx(10.0)
    assert wall["calibration_s"] == 4.0
    assert wall["prelaunch_s"] == pytest.approx(4.0) and wall["launch_s"] == pytest.approx(2.0)
    parts = [
        value
        for key, value in wall_parts(rank_of_launcher, wall).items()
        if key not in ("total_s", "first_step_s")
    ]
    assert sum(parts) - wall["process_group_s"] == pytest.approx(wall["total_s"], rel=1e-6)
    line = describe(wall) or ""
    assert line.startswith("wall time 10.0 s:") and "calibration 4.0 s" in line and "prelaunch 4.0 s" in line
    # A rank that is itself the command (torchrun): its calibration comes out of its own launch.
    rank = WallClock(started=now - 6.0, before=BeforeRanks(started=now - 6.0, calibration_s=4.0))
    rank.mark("launch")
    wall = rank.summary()
    assert wall["total_s"] == pytest.approx(6.0) and wall["prelaunch_s"] == 0.0
    assert wall["launch_s"] == pytest.approx(2.0) and "prelaunch" not in (describe(wall) or "")
