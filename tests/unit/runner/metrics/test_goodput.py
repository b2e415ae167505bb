"""Goodput across a run's attempts: the steps the final model kept, and the time lost to restarts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.metrics import goodput
from runner.rundir.run_files import ATTEMPTS_FILE
from runner.rundir.summary import RunStatus

pytestmark = pytest.mark.unit


def _write(run_dir: Path, *events: dict) -> None:
    (run_dir / ATTEMPTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))


def _start(attempt: int, at: float, from_step: int) -> dict:
    return {"attempt": attempt, "event": "start", "started": at, "time": at + 5, "from_step": from_step}


def _line(attempt: int, event: str, at: float, step: int, steps_s: float, **more) -> dict:
    return {"attempt": attempt, "event": event, "time": at, "step": step, "steps_s": steps_s, **more}


def test_a_killed_attempt_counts_to_its_last_line_and_loses_the_steps_after_the_resumed_checkpoint(tmp_path):
    _write(
        tmp_path,
        _start(0, 100.0, 0),
        _line(0, "checkpoint", 120.0, 10, 10.0),
        _line(0, "progress", 128.0, 18, 18.0),  # then SIGKILL: no end
        _start(1, 140.0, 10),
        _line(1, "end", 170.0, 30, 20.0, status="completed", parts={"launch_s": 3.0, "engine_s": 2.0}),
    )
    account = goodput.account(tmp_path)
    assert account is not None
    killed, finished = account["attempts"]
    assert (killed["status"], killed["wall_s"], killed["to_step"]) == (goodput.NO_END, 28.0, 18)
    assert (killed["steps_kept"], killed["steps_lost"]) == (10, 8)
    assert (killed["kept_s"], killed["lost_s"]) == pytest.approx((10.0, 8.0))
    assert (finished["steps_kept"], finished["kept_s"]) == (20, 20.0)
    assert account["wall_s"] == 58.0 and account["between_attempts_s"] == pytest.approx(12.0)
    assert account["goodput"] == pytest.approx(30.0 / 58.0)
    assert account["goodput_elapsed"] == pytest.approx(30.0 / 70.0)
    line = goodput.describe(account)
    assert line == (
        "goodput over 2 attempts: 52% (30.0 s of kept steps in 58.0 s of attempts); "
        "8 steps trained again (8.0 s); start-up 5.0 s; "
        "10.0 s beyond the steps of attempts killed outright; 12.0 s between attempts"
    )
    assert account["parts_s"] == {"launch_s": 3.0, "engine_s": 2.0} and account["unrecorded_s"] == 10.0


def test_a_killed_attempt_has_the_parts_of_its_last_line(tmp_path):
    """Each line carries the wall time's parts so far: an attempt killed outright is known to its
    last line, start-up and checkpoints included; only a line without parts leaves them unrecorded."""
    so_far = {"total_s": 28.0, "launch_s": 4.0, "engine_s": 3.0, "steps_s": 18.0, "checkpoint_s": 1.5}
    _write(
        tmp_path,
        _start(0, 100.0, 0),
        _line(0, "checkpoint", 120.0, 10, 10.0, parts={**so_far, "total_s": 20.0, "steps_s": 10.0}),
        _line(0, "progress", 128.0, 18, 18.0, parts=so_far),  # then SIGKILL: no end
        _start(1, 140.0, 10),
        _line(1, "end", 170.0, 30, 20.0, status="completed", parts={"launch_s": 3.0, "engine_s": 2.0}),
    )
    account = goodput.account(tmp_path)
    assert account is not None
    killed = account["attempts"][0]
    assert killed["parts"] == so_far and killed["unrecorded_s"] == 0.0
    assert account["startup_s"] == 4.0 + 3.0 + 3.0 + 2.0  # both attempts' launch and engine
    assert account["parts_s"]["checkpoint_s"] == 1.5
    assert account["unrecorded_s"] == 0.0
    assert "killed outright" not in (goodput.describe(account) or "")


def test_a_restart_from_step_0_loses_all_the_earlier_attempt_trained(tmp_path):
    _write(
        tmp_path,
        _start(0, 0.0, 0),
        _line(0, "end", 10.0, 5, 8.0, status="failed"),
        _start(1, 20.0, 0),  # no checkpoint: trained again from the start
        _line(1, "end", 40.0, 10, 16.0, status="completed"),
    )
    first, second = goodput.account(tmp_path)["attempts"]  # type: ignore[index]
    assert (first["steps_kept"], first["steps_lost"], first["lost_s"]) == (0, 5, 8.0)
    assert (second["steps_kept"], second["steps_lost"]) == (10, 0)


def test_a_resume_from_an_older_checkpoint_drops_every_later_step(tmp_path):
    """Attempt 2 resumed from step 4 although attempt 1 went on from 8: attempt 1's steps are lost,
    and attempt 0 keeps only its first 4."""
    _write(
        tmp_path,
        _start(0, 0.0, 0),
        _line(0, "end", 10.0, 8, 8.0, status="interrupted"),
        _start(1, 20.0, 8),
        _line(1, "end", 30.0, 12, 4.0, status="interrupted"),
        _start(2, 40.0, 4),
        _line(2, "end", 50.0, 12, 8.0, status="completed"),
    )
    attempts = goodput.account(tmp_path)["attempts"]  # type: ignore[index]
    assert [(a["steps_kept"], a["steps_lost"]) for a in attempts] == [(4, 4), (0, 4), (8, 0)]


def test_one_attempt_or_no_file_says_nothing_at_the_run_end(tmp_path):
    assert goodput.account(tmp_path) is None
    _write(tmp_path, _start(0, 0.0, 0), _line(0, "end", 10.0, 5, 8.0, status="completed"))
    account = goodput.account(tmp_path)
    assert account is not None and account["goodput"] == pytest.approx(0.8)
    assert goodput.describe(account) is None


def test_the_attempt_log_numbers_attempts_and_writes_progress_at_most_once_a_second(tmp_path):
    first = goodput.AttemptLog(tmp_path, started=1.0, from_step=0, launcher="local")
    asked: list[int] = []

    def parts() -> dict[str, float]:
        asked.append(1)
        return {"total_s": 2.0, "steps_s": 0.2}

    first.progress(1, 0.1, saved=False, logged=True, parts=parts)  # within the second: not written
    assert not asked  # the parts are asked for only when a line is written
    first.progress(2, 0.2, saved=True, logged=False, parts=parts)  # a checkpoint: written, with them
    first.end(status=RunStatus.interrupted, steps_completed=2, steps_s=0.2, parts={"launch_s": 1.0})
    second = goodput.AttemptLog(tmp_path, started=2.0, from_step=2, launcher="local")
    events = [json.loads(line) for line in (tmp_path / ATTEMPTS_FILE).read_text().splitlines()]
    assert [(e["attempt"], e["event"]) for e in events] == [
        (0, "start"),
        (0, "checkpoint"),
        (0, "end"),
        (1, "start"),
    ]
    assert events[1]["parts"] == {"total_s": 2.0, "steps_s": 0.2}
    assert second.number == 1


def _conversion(at: float, seconds: float) -> dict:
    return {"event": "conversion", "time": at, "seconds": seconds, "bytes": 52_000_000, "tag": "step_10"}


def test_a_conversion_before_the_ranks_started_is_named_within_the_time_between_attempts(tmp_path):
    """ladder's own launcher converts a moved checkpoint before it starts the ranks: the gap."""
    _write(
        tmp_path,
        _start(0, 100.0, 0),
        _line(0, "end", 120.0, 10, 10.0, status="interrupted", parts={"launch_s": 3.0}),
        _conversion(131.0, 3.0),
        _start(1, 132.0, 10),
        _line(1, "end", 160.0, 30, 20.0, status="completed", parts={"launch_s": 3.0}),
    )
    account = goodput.account(tmp_path)
    assert account is not None and [a["attempt"] for a in account["attempts"]] == [0, 1]
    assert (account["conversion_s"], account["conversion_between_attempts_s"]) == (3.0, 3.0)
    assert account["between_attempts_s"] == pytest.approx(12.0)
    assert goodput.describe(account) == (
        "goodput over 2 attempts: 62% (30.0 s of kept steps in 48.0 s of attempts); start-up 6.0 s; "
        "12.0 s between attempts (3.0 s of it converting the checkpoint to a new layout)"
    )
    # The next attempt is numbered after the last attempt, not after the conversion's line.
    assert goodput.AttemptLog(tmp_path, started=170.0, from_step=30, launcher="local").number == 2


def test_a_conversion_in_rank_0s_start_up_is_named_within_the_start_up(tmp_path):
    """Under torchrun or srun, rank 0 converts in its own start-up (wall_clock's launch)."""
    _write(
        tmp_path,
        _start(0, 100.0, 0),
        _line(0, "end", 120.0, 10, 10.0, status="interrupted", parts={"launch_s": 3.0}),
        _conversion(133.0, 2.5),
        _start(1, 130.0, 10),
        _line(1, "end", 160.0, 30, 20.0, status="completed", parts={"launch_s": 5.5}),
    )
    account = goodput.account(tmp_path)
    assert account is not None
    assert (account["conversion_s"], account["conversion_between_attempts_s"]) == (2.5, 0.0)
    assert goodput.describe(account) == (
        "goodput over 2 attempts: 60% (30.0 s of kept steps in 50.0 s of attempts); "
        "start-up 8.5 s (2.5 s of it converting the checkpoint to a new layout); 10.0 s between attempts"
    )
