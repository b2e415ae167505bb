"""DeepSpeed's per-parameter-tensor overhead, ZeRO-3's above all: measured with DeepSpeed, kept in
the calibration."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import compose_config

from runner.config import Precision
from runner.plan.planner import Plan, plan_config
from runner.report.plan_table import format_plan
from runner.step_time import device_figures
from runner.step_time.measured import figures as calibrations
from runner.step_time.measured import zero3_overhead as calibrate_zero3

pytestmark = pytest.mark.unit


def test_the_planner_asks_for_it_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The planner's local calibration measures the engine's figures once, with the rank's
    threads; ZeRO-3's hooks are its all-persistent stage 3 less stage 0, its gather stage 3
    less the all-persistent one."""
    monkeypatch.setenv(calibrations.CACHE_ENV, str(tmp_path))
    asked: list[dict[str, object]] = []
    figures = {"0": 0.25e-3, "1": 0.3e-3, "2": 0.5e-3, "3": 1.5e-3, calibrate_zero3.PERSISTENT_KEY: 1.25e-3}

    def fake(**kwargs: object) -> dict[str, float]:
        asked.append(kwargs)
        return dict(figures)

    monkeypatch.setattr(calibrate_zero3, "engine_param_seconds", fake)
    local = device_figures._measure_here(Precision.fp32, cuda=False, threads=1, ranks_here=1)
    assert local.zero3_hook_seconds() == pytest.approx(1e-3)
    assert local.zero3_gather_seconds() == pytest.approx(0.25e-3)
    assert local.engine_param_seconds() == figures
    assert asked == [{"device_type": "cpu", "threads": 1}]


def test_a_record_keeps_the_figures() -> None:
    """A calibration file written and read back keeps the figures, their sources and fits; an
    older file's single ZeRO-3 figure is its cost per gathered tensor; a file without any has
    none (and, being a file, measures nothing)."""
    record = {
        "device": "cpu",
        "zero3_hook_s": 1e-3,
        "zero3_gather_s": 0.25e-3,
        "engine_param_s": {"0": 1e-4},
        "sources": {"copies": "runner/hardware/calibrate.py copy_rate"},
        "fitted": {"zero3_hook_s": {"summary": "least squares over 2 steps", "data": ["a", "b"]}},
    }
    back = calibrations.from_record(calibrations.from_record(record, source="test").to_json(), source="test")
    assert back.zero3_hook_seconds() == 1e-3 and back.zero3_gather_seconds() == 0.25e-3
    assert back.engine_param_seconds() == {"0": 1e-4}
    assert back.to_json()["sources"] == record["sources"] and back.to_json()["fitted"] == record["fitted"]
    assert back.fitted_words("zero3_hook_s") == "least squares over 2 steps"
    assert back.fitted_words("zero3_gather_s") is None
    older = calibrations.from_record({"zero3_param_s": 1.2e-3}, source="an older file")
    assert older.zero3_gather_seconds() == 1.2e-3 and older.zero3_hook_seconds() is None
    bare = calibrations.from_record({}, source="no figures")
    assert bare.zero3_hook_seconds() is None and bare.engine_param_seconds() is None


H200_7B = (
    "model=llama_7b",
    "cluster=h200",
    "gpus=1",
    "precision=bf16",
    "data.seq_len=2048",
    "batch.global_size=16",
    "parallel=zero3",
    "batch.micro_size=1",
)


@pytest.fixture(scope="module")
def h200_plans() -> dict[str, Plan]:
    """llama_7b under ZeRO-3 on one H200 at micro 1, with the derived persistence threshold and
    with every tensor persistent."""
    return {
        "derived": plan_config(compose_config(*H200_7B)),
        "persistent": plan_config(compose_config(*H200_7B, f"parallel.param_persistence_threshold={10**10}")),
    }


def _terms(plan: Plan) -> dict[str, float]:
    return {term.name: term.seconds for term in plan.time.terms}


def test_every_tensor_persistent_still_pays_the_hooks_but_no_gather(h200_plans: dict[str, Plan]) -> None:
    """DeepSpeed's hooks visit every tensor, persistent or not: keeping every tensor whole drops
    the gathers' terms but not the hooks, so the step stays most of what it was."""
    derived, persistent = _terms(h200_plans["derived"]), _terms(h200_plans["persistent"])
    assert derived["zero3 hooks"] > 0
    assert persistent["zero3 hooks"] == pytest.approx(derived["zero3 hooks"])
    assert "zero3 gathers" in derived and "zero3 gathers" not in persistent
    hooks = next(t for t in h200_plans["persistent"].time.terms if t.name == "zero3 hooks")
    assert hooks.words.startswith("291 param tensors visited (0 gathered, 291 persistent)")
    assert h200_plans["persistent"].time.step_s > 0.8 * h200_plans["derived"].time.step_s


def test_a_term_priced_by_a_fitted_figure_says_so(h200_plans: dict[str, Plan], tmp_path: Path) -> None:
    """h200.json's hook figure is fitted to measured steps, not micro-benchmarked: the plan's
    line for it says FITTED and what it was fitted to, and plan.json names the figure."""
    plan = h200_plans["derived"]
    line = next(line for line in format_plan(plan).splitlines() if line.strip().startswith("zero3 hooks"))
    assert "FITTED, not micro-benchmarked: least squares over" in line
    assert "bench/time_model_gpu_table.py --fit" in line
    assert plan.record().time.terms_fitted == {"zero3 hooks": ["zero3_hook_s"]}
    gemm = next(line for line in format_plan(plan).splitlines() if line.strip().startswith("gemm "))
    assert "FITTED" not in gemm
