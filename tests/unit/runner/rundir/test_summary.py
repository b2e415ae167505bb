"""summary.json is strict JSON: what a browser, jq or the report reads without special cases."""

from __future__ import annotations

import errno
import json
import tempfile
from pathlib import Path

import pytest

from runner.rundir.outcome import (
    record_failed,
    record_failed_if_running,
    record_interrupted,
    record_rank_cause,
)
from runner.rundir.summary import (
    SCHEMA_VERSION,
    RunSummary,
    SummaryError,
    load_summary,
    parse_summary,
    read_summary,
    update_summary,
)

pytestmark = pytest.mark.unit


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def test_non_finite_numbers_are_written_as_null(tmp_path: Path) -> None:
    update_summary(
        tmp_path,
        final={"loss": 2.5, "batch/noise_scale": float("nan")},
        history=[float("inf"), 1.0],
    )
    text = (tmp_path / "summary.json").read_text()
    data = json.loads(text, parse_constant=_refuse_constant)  # NaN / Infinity would raise here
    assert data["final"] == {"loss": 2.5, "batch/noise_scale": None}
    assert data["history"] == [None, 1.0]
    assert read_summary(tmp_path)["final"]["loss"] == 2.5


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """No new file can be made (what a full filesystem does to the temporary file beside summary.json)."""

    def no_room(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", no_room)


def test_a_full_disk_still_records_the_run_end_over_the_old_summary(tmp_path: Path, full_disk: None) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"status": "running", "layout": {"dp": 2}}, indent=2))
    update_summary(tmp_path, status="failed", error="OSError: no room")
    assert read_summary(tmp_path) == {"status": "failed", "layout": {"dp": 2}, "error": "OSError: no room"}


def test_what_does_not_fit_over_the_old_summary_is_cut_to_the_status(tmp_path: Path, full_disk: None) -> None:
    running = {"status": "running", "steps_completed": 3}
    (tmp_path / "summary.json").write_text(json.dumps(running, indent=2) + " " * 200)
    update_summary(tmp_path, status="failed", error="OSError: no room", final={"loss": list(range(3000))})
    written = read_summary(tmp_path)
    assert written["status"] == "failed" and written["error"] == "OSError: no room"
    assert "final" not in written
    assert written["summary_cut"].startswith("the filesystem was full")


def test_a_full_disk_with_no_old_summary_raises(tmp_path: Path, full_disk: None) -> None:
    with pytest.raises(OSError, match="No space left"):
        update_summary(tmp_path, status="failed")


def test_a_summary_round_trips_through_its_schema(tmp_path: Path) -> None:
    update_summary(tmp_path, status="running", layout={"dp": 2}, steps_completed=None)
    record_failed(tmp_path, error="RuntimeError: boom", failed_rank=1)
    loaded = load_summary(tmp_path)
    assert loaded == RunSummary(
        schema=SCHEMA_VERSION,
        status="failed",
        error="RuntimeError: boom",
        failed_rank=1,
        records={"layout": {"dp": 2}},
    )
    assert loaded is not None
    assert parse_summary(loaded.to_dict(), tmp_path / "summary.json") == loaded


def test_a_summary_written_before_the_schema_reads_and_is_upgraded(tmp_path: Path) -> None:
    old = {"status": "completed", "error": None, "steps_completed": 8, "final": {"loss": 3.2}}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    loaded = load_summary(tmp_path)
    assert loaded is not None
    assert (loaded.schema, loaded.status, loaded.steps_completed) == (SCHEMA_VERSION, "completed", 8)
    assert loaded.records == {"final": {"loss": 3.2}}
    update_summary(tmp_path, note="resumed")  # a resumed old run keeps its summary's version
    assert "schema" not in read_summary(tmp_path)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"status": "comp', "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"status": "done"}', "key 'status' is 'done'"),
        ('{"status": "failed", "failed_rank": "1"}', "key 'failed_rank' is '1', expected an integer rank"),
        ('{"schema": 99}', "upgrade ladder"),
    ],
)
def test_a_malformed_summary_is_refused_naming_the_file_and_key(
    tmp_path: Path, text: str, words: str
) -> None:
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(SummaryError) as refused:
        load_summary(tmp_path)
    assert str(tmp_path / "summary.json") in str(refused.value)
    assert words in str(refused.value)


def test_the_first_failure_recorded_stays_the_cause(tmp_path: Path) -> None:
    update_summary(tmp_path, status="running")
    record_rank_cause(tmp_path, rank=1, words="RuntimeError: CUDA out of memory")
    record_rank_cause(tmp_path, rank=2, words="DistBackendError: Connection closed by peer")
    record_failed_if_running(tmp_path, error="job 7 ended FAILED")  # the scheduler's verdict comes last
    summary = read_summary(tmp_path)
    assert (summary["status"], summary["failed_rank"]) == ("failed", 1)
    assert summary["error"] == "RuntimeError: CUDA out of memory"
    record_interrupted(tmp_path, words="stopped by SIGTERM")
    assert read_summary(tmp_path)["status"] == "interrupted"
