"""summary.json is strict JSON: what a browser, jq or the report reads without special cases."""

from __future__ import annotations

import errno
import json
import tempfile
from pathlib import Path

import pytest

from runner.rundir.summary import read_summary, update_summary

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
