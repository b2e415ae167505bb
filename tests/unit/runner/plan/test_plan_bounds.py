"""A prediction never beats its bound: every model, precision, datasheet cluster and layout planned
here predicts a step no shorter than the roofline's and an MFU of at most 100%; the ladder marks
the offloaded layouts it cannot time, and its command plans the same experiment again."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from train_helpers import compose_config, plan_json

from launchers.plan_job import plan_job
from runner.config import TrainConfig
from runner.plan.ladder import OFFLOAD_MARK, carried_overrides, recommend
from runner.plan.planner import plan_config, workload_from_config
from runner.report.plan_table import format_ladder

pytestmark = pytest.mark.unit

MODELS = ("tiny", "gpt2_124m", "llama_1b", "llama_7b", "llama_70b")
PRECISIONS = ("fp32", "bf16", "fp16")
# Datasheet clusters only: each plans from a recorded calibration file, measuring nothing here.
CLUSTERS = ("h100_sxm", "h200", "a100_80g")
LAYOUTS = (
    ("parallel=ddp", "gpus=1"),
    ("parallel=zero3", "gpus=8"),
    ("parallel=zero1", "parallel.tp=2", "gpus=8"),
    ("parallel=pp2", "gpus=16", "batch.global_size=64"),
)


def _config(*overrides: str) -> TrainConfig:
    config: TrainConfig = compose_config(*overrides)
    return config


@pytest.fixture(scope="module")
def parts() -> dict[str, TrainConfig]:
    """Each model, precision, cluster and layout composed once; the grid puts them together."""
    done = {o: _config(o) for o in [f"model={m}" for m in MODELS] + [f"precision={p}" for p in PRECISIONS]}
    done |= {f"cluster={c}": _config(f"cluster={c}") for c in CLUSTERS}
    done |= {" ".join(layout): _config(*layout) for layout in LAYOUTS}
    return done


@pytest.mark.parametrize("model", MODELS)
def test_no_prediction_is_faster_than_its_bound(parts: dict[str, TrainConfig], model: str) -> None:
    for precision, cluster, layout in itertools.product(PRECISIONS, CLUSTERS, LAYOUTS):
        shape = parts[" ".join(layout)]
        config = dataclasses.replace(
            shape,
            model=parts[f"model={model}"].model,
            precision=parts[f"precision={precision}"].precision,
            cluster=parts[f"cluster={cluster}"].cluster,
        )
        t = plan_config(config).time
        where = f"{model} {precision} {cluster} {' '.join(layout)}"
        assert t.step_s is not None and t.bound_step_s is not None and t.mfu is not None, where
        assert t.calibration, where  # predicted from the file's terms, not the bound itself
        assert t.step_s >= t.bound_step_s, (
            f"{where}: predicted {t.step_s:.3g} s < bound {t.bound_step_s:.3g} s"
        )
        assert t.mfu <= 1.0, f"{where}: MFU {100 * t.mfu:.1f}%"


def test_fp32_on_a_bf16_calibration_is_scaled_to_the_fp32_peak_and_says_so() -> None:
    """The H200's file holds bf16 GEMM rates; an fp32 plan runs them at 67/989 of those."""
    fp32 = plan_config(_config("model=llama_7b", "cluster=h200", "gpus=1", "precision=fp32")).time
    bf16 = plan_config(_config("model=llama_7b", "cluster=h200", "gpus=1", "precision=bf16")).time
    assert "compute scaled by 0.0677" in fp32.calibration
    assert "67 TFLOP/s fp32" in fp32.calibration and "bfloat16 datasheet peak 989" in fp32.calibration
    assert "scaled" not in bf16.calibration
    gemm = {t.name: t.seconds for t in fp32.terms}["gemm"]
    gemm_bf16 = {t.name: t.seconds for t in bf16.terms}["gemm"]
    assert gemm == pytest.approx(gemm_bf16 * 989 / 67, rel=1e-6)


def test_a_new_users_ladder_recommends_no_layout_above_100_percent_mfu() -> None:
    """`model=llama_7b cluster=h200 gpus=1 planner.recommend=true`, fp32 by default."""
    config = _config("model=llama_7b", "cluster=h200", "gpus=1")
    ladder = recommend(workload_from_config(config))
    assert ladder.ranking
    for candidate in ladder.ranking:
        t = candidate.plan.time
        assert t.mfu is not None and t.mfu <= 1.0, candidate.plan.knobs.describe()


def test_offloaded_layouts_carry_a_mark_not_a_step_time() -> None:
    """llama_70b on 8 H100s fits only with offload: each ranked line says offload is not modelled."""
    config = _config("model=llama_70b", "cluster=h100_sxm", "gpus=8", "precision=bf16")
    text = format_ladder(recommend(workload_from_config(config)))
    rows = [
        line
        for line in text.splitlines()
        if "offload optimizer" in line and line.lstrip()[:2].rstrip(".").isdigit()
    ]
    assert rows
    for row in rows:
        assert OFFLOAD_MARK in row, row
        assert "tokens/s" not in row and "MFU" not in row, row


def test_the_recommended_command_carries_the_plans_other_overrides(tmp_path) -> None:
    given = ["model=llama_7b", "cluster=h200", "gpus=1", "model.n_layer=8", "optimizer.lr=0.001"]
    given += ["planner.recommend=true", "parallel.zero_stage=3", "batch.micro_size=2", "hydra.run.dir=x"]
    config = _config(*[o for o in given if not o.startswith("hydra.")])
    plan_job(config, run_dir=tmp_path, given=given)
    command = plan_json(tmp_path)["recommendation"]["command"]
    assert "model.n_layer=8" in command and "optimizer.lr=0.001" in command
    assert "planner.recommend" not in command and "hydra.run.dir" not in command
    # the layout's own keys come from the recommendation, once
    assert command.count("batch.micro_size=") == 1 and "parallel.zero_stage=3" not in command
    layout = ["model=llama_7b", "parallel=zero1", "batch.micro_size=4"]
    assert carried_overrides(["+model.x=1", "~parallel.tp", "gpus=2"], layout) == ("+model.x=1", "gpus=2")
