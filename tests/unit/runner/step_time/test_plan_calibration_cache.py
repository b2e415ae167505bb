"""This host's calibration: a figure measured on a busy host is cached provisional and measured
again only by a later plan on a quiet host; a long measurement says what it measures."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from train_helpers import compose_config

from runner.errors import ConfigError
from runner.hardware import host_pace
from runner.plan.planner import plan_config
from runner.preflight.validate import validate
from runner.step_time import device_figures
from runner.step_time.measured import figures as calibrations

pytestmark = pytest.mark.unit


def _local(
    answers: list[tuple[Any, bool]],
    asked: list[tuple[str, tuple[int, ...]]],
    quiet: bool,
    paces: list[float] | None = None,
):
    """A local calibration whose measurements pop ``answers`` (value, quiet) and log what was asked;
    with ``paces``, the host's reference readings (runner/hardware/host_pace.py) in the order taken."""

    def measure(kind: str, shape: tuple[int, ...]) -> tuple[Any, bool]:
        asked.append((kind, shape))
        return answers.pop(0)

    pace_now = None if paces is None else functools.partial(paces.pop, 0)
    return calibrations.local(
        "cpu test", "float32", 1, "2.13.0", measure, quiet=lambda: quiet, pace_now=pace_now
    )


def test_a_busy_figure_is_cached_provisional_and_measured_again_on_a_quiet_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))
    asked: list[tuple[str, tuple[int, ...]]] = []
    first = _local([([1e9, 1e9, 1e9], False)], asked, quiet=False)
    assert first.gemm(64, 64, 64) == (1e9, 1e9, 1e9)
    assert "provisional" in first.describe()
    # a later plan on a host still busy uses the cached figure and measures nothing
    busy = _local([], asked, quiet=False)
    assert busy.gemm(64, 64, 64) == (1e9, 1e9, 1e9) and len(asked) == 1
    # a later plan on a quiet host measures it again, once, and keeps the quiet figure for good
    quiet = _local([([2e9, 2e9, 2e9], True)], asked, quiet=True)
    assert quiet.gemm(64, 64, 64) == (2e9, 2e9, 2e9)
    assert quiet.gemm(64, 64, 64) == (2e9, 2e9, 2e9) and len(asked) == 2
    assert "provisional" not in quiet.describe()
    assert _local([], asked, quiet=True).gemm(64, 64, 64) == (2e9, 2e9, 2e9) and len(asked) == 2


def test_a_figure_measured_while_the_host_ran_slow_is_provisional_and_measured_again_at_its_pace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))
    asked: list[tuple[str, tuple[int, ...]]] = []
    slow = 1.0 * host_pace.SLOW_PACE * 1.1  # the reference's seconds in a slow phase, against 1.0
    # the cores look quiet throughout; the second figure's reference ran slow before and after it
    paces = [1.0, 1.0, slow, slow]
    first = _local([([1e9] * 3, True), ([5e8] * 3, True)], asked, quiet=True, paces=paces)
    assert first.gemm(64, 64, 64) == (1e9, 1e9, 1e9) and "provisional" not in first.describe()
    assert first.gemm(128, 128, 128) == (5e8, 5e8, 5e8)
    words = "1 figure(s) measured while other processes held the cores or the host ran slow"
    assert words in first.describe()
    # a later plan in a slow phase (its reading on loading, then before measuring again) keeps it
    paces = [slow, slow]
    still = _local([], asked, quiet=True, paces=paces)
    assert still.gemm(128, 128, 128) == (5e8, 5e8, 5e8) and len(asked) == 2 and not paces
    # a later plan at the host's pace measures it again, once, and keeps it for good
    paces = [1.0, 1.0, 1.0, 1.0]
    at_pace = _local([([1e9] * 3, True)], asked, quiet=True, paces=paces)
    assert at_pace.gemm(128, 128, 128) == (1e9, 1e9, 1e9) and len(asked) == 3
    assert "provisional" not in at_pace.describe()
    assert _local([], asked, quiet=True, paces=[1.0]).gemm(128, 128, 128) == (1e9, 1e9, 1e9)
    assert len(asked) == 3


def test_a_calibration_measured_wholly_in_a_slow_phase_is_measured_again_by_a_faster_plan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))
    asked: list[tuple[str, tuple[int, ...]]] = []
    slow = 1.0 * host_pace.SLOW_PACE * 1.1
    first = _local([([5e8] * 3, True)], asked, quiet=True, paces=[slow, slow])
    assert first.gemm(64, 64, 64) == (5e8, 5e8, 5e8) and "provisional" not in first.describe()
    # the next plan's reading on loading is the host's fastest yet: the figure was slow after all
    faster = _local([([1e9] * 3, True)], asked, quiet=True, paces=[1.0, 1.0, 1.0, 1.0])
    assert "1 figure(s)" in faster.describe()
    assert faster.gemm(64, 64, 64) == (1e9, 1e9, 1e9) and len(asked) == 2
    assert "provisional" not in faster.describe()


def test_the_host_reference_times_a_small_matmul() -> None:
    seconds = host_pace.reference_seconds()
    assert 0 < seconds < 0.1  # a 256^3 matmul: about 0.2 ms on 2 cores
    assert host_pace.slow(seconds * host_pace.SLOW_PACE * 1.01, seconds)
    assert not host_pace.slow(seconds * host_pace.SLOW_PACE * 0.99, seconds)
    assert not host_pace.slow(seconds, None)


def test_a_measurement_past_two_seconds_says_what_it_measures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(device_figures, "PROGRESS_AFTER_S", 0.05)
    with device_figures._progress("gemm", (128, 8192, 1024), "bfloat16"):
        time.sleep(0.3)
    with device_figures._progress("copy", (1024,), "float32"):
        pass  # done before the line is due: nothing said
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "calibrating this host: GEMM (M x K x N) 128x8192x1024 bfloat16" in err


def test_a_datasheet_cluster_never_measures_this_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("measured this host")

    monkeypatch.setattr(device_figures, "_measure_here", refuse)
    monkeypatch.setattr(device_figures, "measured_cpu_peak", refuse)
    for cluster in ("h200", "h100_sxm", "a100_80g"):
        config = compose_config("model=llama_70b", f"cluster={cluster}", "parallel=zero3", "gpus=64")
        assert plan_config(config).time.calibration
    assert not list(tmp_path.iterdir())


def test_a_capped_non_gemm_part_is_measured_small_cached_and_scaled_to_the_runs_tokens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))
    asked: list[tuple[str, tuple[int, ...]]] = []
    # the floor at the trivial shape, then the capped shape: 1 ms of ops plus 9 ms of bytes
    here = _local([(1e-3, True), (1e-2, True)], asked, quiet=True)
    here.rest_cap_elements = 2**20
    seconds, floor, words = here.rest_seconds(8, 2048, 2048, 16, 8, 8192, compiled=False)  # type: ignore[misc]
    trivial = calibrations.floor_shape(16, 8)
    assert asked == [("rest", trivial), ("rest", (1, 128, 2048, 16, 8, 8192))]  # 128 x 8192 = 2^20
    assert floor == 1e-3 and seconds == pytest.approx(1e-3 + 9e-3 * 128)  # 16,384 tokens / 128
    assert words == "measured at 1,128,2048,16,8,8192, scaled by the tokens and widths"
    again = _local([], asked, quiet=True)  # a later plan: the cache, nothing measured
    again.rest_cap_elements = 2**20
    assert again.rest_seconds(8, 2048, 2048, 16, 8, 8192, compiled=False) == (seconds, floor, words)
    assert len(asked) == 2
    assert calibrations.from_record(again.to_json(), source="").rest == again.rest
    assert "non-GEMM part (micro, seq, d_model, heads, kv heads, ffn) 1x128x2048x16x8x8192" in (
        device_figures._WHAT["rest"].format(shape="1x128x2048x16x8x8192", dtype="float32")
    )


def test_figures_measured_by_an_older_method_are_measured_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))
    asked: list[tuple[str, tuple[int, ...]]] = []
    first = _local([([1e9, 1e9, 1e9], True)], asked, quiet=True)
    first.gemm(64, 64, 64)
    assert first.path is not None and f"method{calibrations.METHOD_VERSION}" in first.path.name
    monkeypatch.setattr(calibrations, "METHOD_VERSION", calibrations.METHOD_VERSION + 1)
    later = _local([([2e9, 2e9, 2e9], True)], asked, quiet=True)
    assert later.gemm(64, 64, 64) == (2e9, 2e9, 2e9) and len(asked) == 2


def test_a_local_plan_from_a_calibration_file_measures_nothing_and_names_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """cluster=local cluster.calibration=FILE (LADDER_CALIBRATION by default): this host's figures
    come from the file; a run in another precision scales its compute by this host's peaks' ratio."""
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path / "cache"))
    record = {
        "device": "cpu recorded",
        "dtype": "float32",
        "threads": 2,
        "where": "host-a",
        "measured": "2026-12-07T00:00:00+00:00",
        "gemms": {"1024,128,128": [5e10, 5e10, 5e10]},
        "provisional": [["gemm", "1024,128,128"]],  # the cache it came from measured it busy
    }
    path = tmp_path / "host.json"
    path.write_text(json.dumps(record))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("measured this host")

    monkeypatch.setattr(device_figures, "_measure_here", refuse)
    monkeypatch.setattr(
        device_figures, "measured_cpu_peak", lambda precision: 4e11 if precision == "bf16" else 1e11
    )
    monkeypatch.setenv("LADDER_CALIBRATION", str(path))
    fp32 = plan_config(compose_config()).workload.device.calibration
    assert fp32 is not None and fp32.gemm(1024, 128, 128) == (5e10, 5e10, 5e10)
    assert fp32.describe().startswith(
        f"calibration file {path}: recorded on cpu recorded (host-a) in float32"
    )
    assert "provisional" not in fp32.describe()
    bf16 = plan_config(compose_config("precision=bf16")).workload.device.calibration
    assert bf16 is not None and bf16.gemm(1024, 128, 128) == (2e11, 2e11, 2e11)
    assert "compute scaled by 4 (this host's bf16 peak over its fp32 peak" in bf16.describe()
    assert not (tmp_path / "cache").exists()  # nothing measured, nothing cached


def test_a_calibration_file_that_is_not_there_is_refused_with_the_key_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.json"
    monkeypatch.setenv("LADDER_CALIBRATION", str(missing))
    with pytest.raises(ConfigError) as refused:
        validate(compose_config(), launcher=None)
    assert f"cluster.calibration={missing}: no such calibration file" in str(refused.value)
    assert "record one with python bench/calibrate_device.py" in str(refused.value)
    assert "unset LADDER_CALIBRATION" in str(refused.value)
