"""The CPU peak MFU divides by: the best calibration per CPU, threads and precision, then reused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.config import Precision
from runner.hardware import mfu_peak as peak

pytestmark = pytest.mark.unit


@pytest.fixture
def calibrations(monkeypatch, tmp_path: Path) -> Iterator[list[float]]:
    """Each calibration pops its figure from the front of the list; the cache lives in tmp_path."""
    figures: list[float] = []
    monkeypatch.setenv("LADDER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "calibrate_cpu_peak", lambda dtype: figures.pop(0))
    yield figures


def test_the_best_of_the_first_calibrations_is_kept_then_reused_unmeasured(calibrations) -> None:
    calibrations.extend([5e9, 9e9, 7e9])  # the second run measured on a free core
    seen = [peak.best_cpu_peak(Precision.fp32).flops for _ in range(peak.CALIBRATIONS_KEPT)]
    assert seen == [5e9, 9e9, 9e9]
    reused = peak.best_cpu_peak(Precision.fp32)  # no figure left: a measurement would fail
    assert reused.flops == 9e9
    assert "best of 3 matmul calibrations" in reused.source and "remove it to measure again" in reused.source


def test_each_precision_has_its_own_calibrations(calibrations) -> None:
    calibrations.extend([4e9, 1e9])
    assert peak.best_cpu_peak(Precision.fp32).flops == 4e9
    assert peak.best_cpu_peak(Precision.bf16).flops == 1e9


def test_a_bf16_peak_from_torchs_kernels_is_not_reused_for_fp32_matmuls(calibrations, monkeypatch) -> None:
    """Where bf16 matmuls run in fp32 (runner/hardware/cpu_half_matmul.py) a figure kept from torch's
    reference kernel, 1/10 of it and less, would put every bf16 run far above 100% MFU."""
    monkeypatch.setattr(peak, "computes_in_fp32", lambda dtype: False)
    calibrations.extend([1e9] * peak.CALIBRATIONS_KEPT + [60e9])
    for _ in range(peak.CALIBRATIONS_KEPT):
        peak.best_cpu_peak(Precision.bf16)
    monkeypatch.setattr(peak, "computes_in_fp32", lambda dtype: True)
    widened = peak.best_cpu_peak(Precision.bf16)  # measured anew, under its own key
    assert widened.flops == 60e9
    assert "bf16 matmuls computed in fp32" in widened.source


def test_an_unreadable_cache_measures_again_and_an_earlier_format_counts_once(calibrations, tmp_path) -> None:
    (tmp_path / "cpu_peak.json").write_text("{not json")
    calibrations.append(3e9)
    assert peak.best_cpu_peak(Precision.fp32).flops == 3e9
    key = next(iter(json.loads((tmp_path / "cpu_peak.json").read_text())))
    (tmp_path / "cpu_peak.json").write_text(json.dumps({key: 8e9}))  # a bare best figure
    calibrations.extend([2e9, 2e9])
    assert [peak.best_cpu_peak(Precision.fp32).flops for _ in range(3)] == [8e9, 8e9, 8e9]
    kept = json.loads((tmp_path / "cpu_peak.json").read_text())
    assert (kept[key], kept["calibrations"][key]) == (8e9, 3)


def test_a_run_above_the_kept_peak_makes_the_next_runs_calibrate_again(calibrations, tmp_path) -> None:
    calibrations.extend([1e9, 1e9, 1e9])  # three calibrations on cores other processes held
    for _ in range(peak.CALIBRATIONS_KEPT):
        peak.best_cpu_peak(Precision.fp32)
    kept = peak.best_cpu_peak(Precision.fp32)  # reused
    assert peak.above_calibrated_peak(kept, 0.8, Precision.fp32) is None
    assert peak.above_calibrated_peak(peak.Peak(1e9, "cluster.peak_tflops"), 3.0, Precision.fp32) is None
    warning = peak.above_calibrated_peak(kept, 3.0, Precision.fp32)
    assert warning is not None and "MFU 3.00 is above 1" in warning and "calibrate again" in warning
    calibrations.append(3e9)  # the next run measures on free cores, and its figure is kept
    assert peak.best_cpu_peak(Precision.fp32).flops == 3e9
    key = next(k for k in json.loads((tmp_path / "cpu_peak.json").read_text()) if k != "calibrations")
    assert json.loads((tmp_path / "cpu_peak.json").read_text())["calibrations"][key] == 1
