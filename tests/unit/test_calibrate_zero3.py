"""ZeRO-3's per-parameter-tensor overhead: measured with DeepSpeed, kept in the calibration."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.config import Precision
from runner.hardware import calibrate_zero3
from runner.plan import calibration as calibrations
from runner.plan import hardware

pytestmark = pytest.mark.unit


def test_zero3_overhead_is_measured_with_deepspeed() -> None:
    """One DeepSpeed child (about 5 s here): a tensor's gather/release/reduce costs some
    microseconds to a few milliseconds on a CPU, never nothing and never 50 ms."""
    seconds = calibrate_zero3.zero3_param_seconds(device_type="cpu", threads=1)
    assert seconds is not None, "the child failed: run python -m runner.hardware.calibrate_zero3"
    assert 0 < seconds < 0.05


def test_the_planner_asks_for_it_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The planner's local calibration measures the figure under the kind its accessor names,
    once, with the rank's threads."""
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))
    asked: list[dict[str, object]] = []

    def fake(**kwargs: object) -> float:
        asked.append(kwargs)
        return 1.25e-3

    monkeypatch.setattr(calibrate_zero3, "zero3_param_seconds", fake)
    local = hardware._measure_here(Precision.fp32, cuda=False, threads=1, ranks_here=1)
    assert local.zero3_param_seconds() == 1.25e-3
    assert local.zero3_param_seconds() == 1.25e-3
    assert asked == [{"device_type": "cpu", "threads": 1}]


def test_a_record_keeps_the_figure() -> None:
    """A calibration file written and read back keeps the figure; an older file without it
    has none (and, being a file, measures nothing)."""
    recorded = calibrations.from_record({"device": "cpu", "zero3_param_s": 1.25e-3}, source="test")
    back = calibrations.from_record(recorded.record(), source="test")
    assert back.record()["zero3_param_s"] == 1.25e-3
    assert back.zero3_param_seconds() == 1.25e-3
    assert calibrations.from_record({}, source="an older file").zero3_param_seconds() is None
