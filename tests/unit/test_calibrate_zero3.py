"""DeepSpeed's per-parameter-tensor overhead, ZeRO-3's above all: measured with DeepSpeed, kept in
the calibration."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.config import Precision
from runner.hardware import calibrate_zero3
from runner.plan import calibration as calibrations
from runner.plan import hardware

pytestmark = pytest.mark.unit


def test_the_engine_overhead_is_measured_with_deepspeed() -> None:
    """One DeepSpeed child (about 8 s here): the engine adds at most a few milliseconds per
    tensor and micro-batch on a CPU at every stage, never 50 ms; ZeRO-3 (its gathers and
    releases) adds the most, and more for a larger tensor: some seconds per GB."""
    seconds = calibrate_zero3.engine_param_seconds(device_type="cpu", threads=1)
    assert seconds is not None, "the child failed: run python -m runner.hardware.calibrate_zero3"
    per_byte = seconds.pop(calibrate_zero3.BYTE_KEY)
    assert set(seconds) == {"0", "1", "2", "3"}
    assert all(0 <= value < 0.05 for value in seconds.values())
    assert seconds["3"] == max(seconds.values()) > 0
    assert 0 < per_byte * 1e9 < 100


def test_the_planner_asks_for_it_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The planner's local calibration measures the engine's figures once, with the rank's
    threads, and ZeRO-3's own figure is stage 3's less stage 0's."""
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))
    asked: list[dict[str, object]] = []

    def fake(**kwargs: object) -> dict[str, float]:
        asked.append(kwargs)
        return {"0": 0.25e-3, "1": 0.3e-3, "2": 0.5e-3, "3": 1.5e-3}

    monkeypatch.setattr(calibrate_zero3, "engine_param_seconds", fake)
    local = hardware._measure_here(Precision.fp32, cuda=False, threads=1, ranks_here=1)
    assert local.zero3_param_seconds() == pytest.approx(1.25e-3)
    assert local.engine_param_seconds() == {"0": 0.25e-3, "1": 0.3e-3, "2": 0.5e-3, "3": 1.5e-3}
    assert asked == [{"device_type": "cpu", "threads": 1}]


def test_a_record_keeps_the_figure() -> None:
    """A calibration file written and read back keeps the figures; an older file without them
    has none (and, being a file, measures nothing)."""
    record = {"device": "cpu", "zero3_param_s": 1.25e-3, "engine_param_s": {"0": 1e-4}}
    recorded = calibrations.from_record(record, source="test")
    back = calibrations.from_record(recorded.record(), source="test")
    assert back.record()["zero3_param_s"] == 1.25e-3
    assert back.zero3_param_seconds() == 1.25e-3
    assert back.engine_param_seconds() == {"0": 1e-4}
    older = calibrations.from_record({}, source="an older file")
    assert older.zero3_param_seconds() is None and older.engine_param_seconds() is None
