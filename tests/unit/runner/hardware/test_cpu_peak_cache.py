"""The CPU peak MFU divides by: calibrated once per machine (CPU, threads, precision, torch) as a high
percentile of several rounds, then reused, so that MFU compares run to run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runner.config import Precision
from runner.hardware import mfu_peak as peak

pytestmark = pytest.mark.unit

QUIET = [10e9, 10.2e9, 9.9e9, 10.1e9, 10e9, 10.3e9, 9.8e9, 10e9, 10.1e9]  # rounds within a few %
QUIET_PEAK = 10.14e9  # its 80th percentile: 7th of 9 sorted (10.1) + 0.4 x (8th - 7th)
BUSY = [5e9, 9e9, 4.8e9, 9.5e9, 5.2e9, 10e9, 5e9, 9e9, 5.1e9]  # another process on a core for half of them


class Others:
    """runner/hardware/cpu_busy.py's reading, as the test sets it: the cores other processes held."""

    held = 0.0
    cpus = frozenset({0, 1})

    @classmethod
    def start(cls) -> Others:
        return cls()

    def cores(self) -> float:
        return Others.held


@pytest.fixture
def calibrations(monkeypatch, tmp_path: Path) -> Iterator[list[list[float]]]:
    """Each calibration pops its rounds from the front of the list; the cache lives in tmp_path; no
    other process holds a core unless a test says so (Others.held); torch has 2 threads."""
    rounds: list[list[float]] = []
    monkeypatch.setenv("LADDER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "calibrate_cpu_rounds", lambda dtype: rounds.pop(0))
    monkeypatch.setattr(peak, "OthersUse", Others)
    monkeypatch.setattr(Others, "held", 0.0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    yield rounds


def test_a_calibration_keeps_a_high_percentile_of_its_rounds_and_every_later_run_reuses_it(calibrations):
    """Not the best round (one lucky round would set MFU for good): the 80th percentile, measured once."""
    calibrations.append([*QUIET[:-1], 14e9])  # one round far above the rest
    first = peak.best_cpu_peak(Precision.fp32)
    assert first.flops == pytest.approx(10.24e9)  # 80th percentile: 10.2 + 0.4 x (10.3 - 10.2), not 14
    assert "80th percentile of 9 matmul rounds" in first.source
    later = [peak.best_cpu_peak(Precision.fp32).flops for _ in range(5)]  # no rounds left to pop
    assert later == [first.flops] * 5


def test_rounds_that_disagree_are_measured_again_and_the_higher_figure_kept_meanwhile(calibrations):
    calibrations.extend([BUSY, [x / 2 for x in BUSY], BUSY])
    figures = [peak.best_cpu_peak(Precision.fp32) for _ in range(peak.TRIES)]
    assert figures[0].flops == figures[1].flops == figures[2].flops  # the half-speed try did not replace it
    assert "calibrating again" in figures[0].source
    assert f"kept after {peak.TRIES} calibrations" in figures[2].source
    assert peak.best_cpu_peak(Precision.fp32).flops == figures[0].flops  # no rounds left: reused


def test_a_calibration_while_other_processes_held_the_cores_is_provisional(calibrations, monkeypatch):
    """Rounds that agree, all slowed alike by a process on a core throughout: kept, said to be
    provisional, reused unmeasured while the cores stay busy (no run pays for it again), and
    measured again by the first run that finds them quiet."""
    monkeypatch.setattr(Others, "held", 1.0)
    calibrations.extend([[x / 2 for x in QUIET]])
    figures = [peak.best_cpu_peak(Precision.fp32) for _ in range(3)]
    assert [f.flops for f in figures] == pytest.approx([QUIET_PEAK / 2] * 3)
    assert not calibrations  # measured once
    assert "provisional: other processes held 1.0 cores, calibrating again once they are quiet" in (
        figures[0].source
    )
    monkeypatch.setattr(Others, "held", 0.1)  # a daemon's worth
    calibrations.append(QUIET)
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(QUIET_PEAK)
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(QUIET_PEAK)  # settled: reused


def test_the_other_ranks_of_the_run_do_not_make_a_calibration_busy(calibrations, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # 2 ranks on 2 cores, 1 thread each
    monkeypatch.setattr(Others, "held", 1.0)  # the other rank
    calibrations.append(QUIET)
    assert "provisional" not in peak.best_cpu_peak(Precision.fp32, ranks=2).source
    assert peak.best_cpu_peak(Precision.fp32, ranks=2).flops == pytest.approx(QUIET_PEAK)  # reused


def test_busy_rounds_give_way_to_quiet_ones(calibrations):
    calibrations.extend([BUSY, QUIET])
    busy = peak.best_cpu_peak(Precision.fp32)
    quiet = peak.best_cpu_peak(Precision.fp32)
    assert busy.flops == pytest.approx(9.2e9) and "spread" in busy.source
    assert quiet.flops == pytest.approx(QUIET_PEAK) and "spread" not in quiet.source
    assert peak.best_cpu_peak(Precision.fp32).flops == quiet.flops


def test_another_thread_count_or_torch_version_calibrates_anew(calibrations, monkeypatch):
    calibrations.extend([QUIET, [x / 2 for x in QUIET], [x * 1.1 for x in QUIET]])
    two = peak.best_cpu_peak(Precision.fp32).flops
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = peak.best_cpu_peak(Precision.fp32)
    assert one.flops == pytest.approx(two / 2)
    monkeypatch.setattr(torch, "__version__", "99.0.0")
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(one.flops * 2.2)


def test_the_source_and_the_record_state_ranks_times_threads(calibrations, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    calibrations.append(QUIET)
    two_ranks = peak.best_cpu_peak(Precision.fp32, ranks=2)
    assert "1 thread per rank (this run: 2 ranks x 1 thread = 2 in all)" in two_ranks.source
    record = two_ranks.calibration_record(ranks=2)
    assert record is not None
    assert (record["ranks"], record["threads_per_rank"], record["threads_in_all"]) == (2, 1, 2)
    assert record["rounds"] == QUIET and record["torch"] == str(torch.__version__)
    assert peak.Peak(1e12, "cluster.peak_tflops").calibration_record(ranks=2) is None


def test_each_precision_has_its_own_calibration(calibrations):
    calibrations.extend([QUIET, [x / 4 for x in QUIET]])
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(QUIET_PEAK)
    assert peak.best_cpu_peak(Precision.bf16).flops == pytest.approx(QUIET_PEAK / 4)


def test_a_bf16_peak_from_torchs_kernels_is_not_reused_for_fp32_matmuls(calibrations, monkeypatch):
    """Where bf16 matmuls run in fp32 (runner/hardware/cpu_half_matmul.py) a figure kept from torch's
    reference kernel, 1/10 of it and less, would put every bf16 run far above 100% MFU."""
    monkeypatch.setattr("runner.hardware.cpu_half_matmul.computes_in_fp32", lambda dtype: False)
    calibrations.extend([[1e9] * 9, [60e9] * 9])
    peak.best_cpu_peak(Precision.bf16)
    monkeypatch.setattr("runner.hardware.cpu_half_matmul.computes_in_fp32", lambda dtype: True)
    widened = peak.best_cpu_peak(Precision.bf16)  # measured anew, under its own key
    assert widened.flops == 60e9
    assert "bf16 matmuls computed in fp32" in widened.source


def test_an_unreadable_or_earlier_cache_measures_again(calibrations, tmp_path):
    (tmp_path / "cpu_peak.json").write_text("{not json")
    calibrations.extend([QUIET, QUIET])
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(QUIET_PEAK)
    key = next(iter(json.loads((tmp_path / "cpu_peak.json").read_text())["peaks"]))
    # The earlier format: best-of figures at the top level, counted under "calibrations".
    (tmp_path / "cpu_peak.json").write_text(json.dumps({key: 8e9, "calibrations": {key: 3}}))
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(QUIET_PEAK)
    assert calibrations == []


def test_a_run_above_the_kept_peak_makes_the_next_run_calibrate_again(calibrations):
    calibrations.append([1e9] * 9)  # rounds alike, all on cores another process held
    kept = peak.best_cpu_peak(Precision.fp32)
    assert peak.above_calibrated_peak(kept, 0.8, Precision.fp32) is None
    assert peak.above_calibrated_peak(peak.Peak(1e9, "cluster.peak_tflops"), 3.0, Precision.fp32) is None
    warning = peak.above_calibrated_peak(kept, 3.0, Precision.fp32)
    assert warning is not None and "MFU 3.00 is above 1" in warning and "calibrate again" in warning
    calibrations.append(QUIET)  # the next run measures on free cores, and its figure is kept
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(QUIET_PEAK)
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(QUIET_PEAK)


def test_a_process_without_torch_finds_the_kept_peak_without_loading_it(calibrations, monkeypatch):
    """A launching process plans before any rank loads torch: where an earlier process under the same
    conditions (CPU, cores, thread variables, torch's installed version) worked out the key, it reads
    the kept peak without asking torch; other conditions ask torch again."""
    monkeypatch.setattr(peak, "_torch_loaded", lambda: False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    calibrations.append(QUIET)
    first = peak.best_cpu_peak(Precision.fp32)  # works the key out with torch, and records it

    def asks_torch(precision):
        raise AssertionError("asked torch for the key")

    with monkeypatch.context() as without_torch:
        without_torch.setattr(peak, "_cache_key", asks_torch)
        again = peak.best_cpu_peak(Precision.fp32)
    assert (again.flops, again.source) == (first.flops, first.source)

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # another thread count when torch starts: its own key
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    calibrations.append([x / 2 for x in QUIET])
    assert peak.best_cpu_peak(Precision.fp32).flops == pytest.approx(QUIET_PEAK / 2)
    assert calibrations == []
