"""What a stopped local run says and keeps (launchers/run.py, train.py), without starting ranks."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from train_helpers import ROOT, compose_config

from launchers import run as run_module
from launchers.local import LaunchResult
from runner.layout import resolve_layout
from runner.rundir.identity import RunIdentity
from runner.rundir.summary import Outcome, RunStatus, read_summary, write_outcome
from runner.train.context import RankJob

pytestmark = pytest.mark.unit


def _stopped_run(
    tmp_path, monkeypatch, result: LaunchResult, *, status: RunStatus, checkpoint_at: int | None
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_outcome(run_dir, Outcome(status=status))
    if checkpoint_at is not None:
        tag = f"step_{checkpoint_at:08d}"
        (run_dir / "checkpoints" / tag).mkdir(parents=True)
        latest = {"tag": tag, "completed_steps": checkpoint_at}
        (run_dir / "checkpoints" / "latest.json").write_text(json.dumps(latest))
    monkeypatch.setattr(run_module, "launch_local", lambda **_: result)
    config = compose_config("gpus=2")
    layout = resolve_layout(gpus=2, tp=1, pp=1, global_size=16, micro_size=8)
    identity = RunIdentity.for_run_dir(run_dir, name="test", group=None)
    job = RankJob(config=config, layout=layout, ds_config={})
    return run_dir, lambda: run_module._run_local(job, run_dir, identity)


def test_a_run_that_completed_as_the_signal_came_is_completed(tmp_path, monkeypatch):
    """Ctrl-C during the last step: the ranks finished it and wrote "completed"; so it stays."""
    run_dir, launch = _stopped_run(
        tmp_path,
        monkeypatch,
        LaunchResult(0, None, stopped_by="SIGINT"),
        status=RunStatus.completed,
        checkpoint_at=None,
    )
    assert launch().status == "completed"
    assert read_summary(run_dir)["status"] == "completed"


def test_ranks_killed_at_a_second_signal_name_the_checkpoint_a_resume_loads(tmp_path, monkeypatch):
    result = LaunchResult(0, None, stopped_by="SIGINT", killed=True)
    run_dir, launch = _stopped_run(tmp_path, monkeypatch, result, status=RunStatus.running, checkpoint_at=4)
    with pytest.raises(run_module.RunInterrupted, match="killed at a second SIGINT") as stopped:
        launch()
    assert "the newest is step_00000004 (4 steps), where train.resume=auto continues" in str(stopped.value)
    assert read_summary(run_dir)["status"] == "interrupted"


def test_the_continue_command_keeps_the_overrides_and_names_the_directory(tmp_path):
    sys.path.insert(0, str(ROOT))
    from train import continue_command

    argv = ["train.py", "gpus=2", "train.resume=never", "hydra.run.dir=old", "optimizer.lr=1e-3"]
    # stopped before its first checkpoint (a second Ctrl-C): resume=required would be refused
    assert continue_command(argv, tmp_path / "run", None) == (
        f"python train.py gpus=2 optimizer.lr=1e-3 train.resume=auto hydra.run.dir={tmp_path / 'run'}"
    )
    (tmp_path / "run" / "checkpoints" / "step_00000004").mkdir(parents=True)
    latest = {"tag": "step_00000004", "completed_steps": 4}
    (tmp_path / "run" / "checkpoints" / "latest.json").write_text(json.dumps(latest))
    assert continue_command(argv, tmp_path / "run", None) == (
        f"python train.py gpus=2 optimizer.lr=1e-3 train.resume=required hydra.run.dir={tmp_path / 'run'}"
    )
    sweep = ["train.py", "-m", "parallel=ddp,zero1", "hydra.sweep.dir=s"]
    assert continue_command(sweep, tmp_path / "s" / "0", tmp_path / "s") == (
        f"python train.py -m parallel=ddp,zero1 train.resume=auto hydra.sweep.dir={tmp_path / 's'}"
    )


def test_a_save_too_slow_for_torchruns_grace_is_said_once(caplog):
    from runner.train.saving import LAUNCHER_KILL_AFTER_S, slow_save_warning

    with caplog.at_level(logging.WARNING, logger="ladder"):
        slow_save_warning(LAUNCHER_KILL_AFTER_S / 4, source="torchrun", warned=False)
        slow_save_warning(LAUNCHER_KILL_AFTER_S, source="local", warned=False)  # ladder's launcher waits
        slow_save_warning(LAUNCHER_KILL_AFTER_S, source="torchrun", warned=True)
        assert not caplog.records
        slow_save_warning(LAUNCHER_KILL_AFTER_S * 0.6, source="torchrun", warned=False)
    (record,) = caplog.records
    assert "a checkpoint took 18 s; torchrun" in record.getMessage()
    assert "kills its ranks 30 s after its SIGTERM" in record.getMessage()


# A stand-in rank: notes the stop signal it gets in its file, as a rank's summary does, and exits 75.
_RANK = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    out.write_text(signal.Signals(signum).name)
    sys.exit(75)
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, stop)
out.with_suffix(".ready").touch()
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize(
    ("received", "passed_on"), [("SIGINT", "SIGINT"), ("SIGTERM", "SIGTERM"), ("SIGHUP", "SIGTERM")]
)
def test_the_launcher_passes_the_stop_signal_on_as_it_came(tmp_path, received, passed_on):
    """``kill -INT`` to train.py alone: the ranks get SIGINT and say so ("stopped by SIGINT"), not
    SIGTERM; SIGHUP, which ranks do not take, reaches them as SIGTERM."""
    import subprocess
    import time

    from launchers.local import StopRequests, _watch

    notes = [tmp_path / f"rank{rank}.txt" for rank in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(note)]) for note in notes]
    deadline = time.monotonic() + 60
    while not all(note.with_suffix(".ready").exists() for note in notes) and time.monotonic() < deadline:
        time.sleep(0.02)
    stops = StopRequests()
    stops.received.append(received)
    result = _watch(procs, stops)
    assert result.stopped_by == received and result.failed_rank is None
    assert [note.read_text() for note in notes] == [passed_on, passed_on]
