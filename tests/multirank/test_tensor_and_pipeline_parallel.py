"""Tensor and pipeline parallelism together keep the experiment and quarter what a rank holds.

fp32 on CPU, global batch 16 as micro 4 x accum 4: one rank against tp 2 x pp 2 on 4 ranks
(dp 1), started by torchrun, which this 2-core host allows where ladder's local launcher
keeps one rank per core. Tied embeddings at ZeRO-0 (ladder's own clipping over the stages
and the tensor-parallel ranks); untied at ZeRO-1, a run that leaves tp 2 x pp 2 for one
rank after 4 steps and comes back after 7: the plain run's losses throughout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import (
    FP32_TOLERANCE,
    REFERENCE_STEPS,
    SMALL_EXPERIMENT,
    TrainResult,
    run_in_legs,
    run_torchrun,
)

pytestmark = pytest.mark.multirank

STEPS = REFERENCE_STEPS
COMMON = SMALL_EXPERIMENT
TP_PP = ["gpus=4", "parallel.tp=2", "parallel.pp=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_rank_reference, one_rank_untied_reference) -> dict[str, TrainResult]:
    """One rank and tp 2 x pp 2, tied and untied; the untied run moves to one rank and back."""
    root: Path = tmp_path_factory.mktemp("tp_pp")
    # The tiny model ties its embeddings; the untied runs set model.tie_embeddings=false.
    results = {"plain/tied=true": one_rank_reference, "plain/tied=false": one_rank_untied_reference}
    tied_overrides = [*TP_PP, "parallel=ddp", f"train.steps={STEPS}", *COMMON]
    tied = run_torchrun(*tied_overrides, nproc=4, run_dir=root / "tp_pp_tied")
    assert tied.returncode == 0, tied.stderr[-3000:]
    results["tp_pp/tied=true"] = tied
    # Untied, the run leaves tp 2 x pp 2 and comes back: 4 steps on it at ZeRO-1, 3 on one
    # rank at ZeRO-2 (every stage's shards joined through the universal checkpoint, by the
    # splits each stage recorded), the last 3 on tp 2 x pp 2 again (each rank loads its
    # stage's slices).
    legs = [
        [*TP_PP, "parallel=zero1", "train.steps=4"],
        ["gpus=1", "parallel=zero2", "train.steps=7"],
        [*TP_PP, "parallel=zero1", f"train.steps={STEPS}"],
    ]
    untied = [*COMMON, "model.tie_embeddings=false"]
    resumed, resumed_from = run_in_legs(legs, *untied, run_dir=root / "tp_pp_untied")
    assert resumed_from == [None, 4, 7]
    results["tp_pp/tied=false"] = resumed
    return results


@pytest.mark.parametrize("tie", ["true", "false"])
def test_tensor_and_pipeline_parallel_give_the_losses_of_one_rank(runs, tie):
    plain = [m["loss"] for m in runs[f"plain/tied={tie}"].metrics]
    layered = [m["loss"] for m in runs[f"tp_pp/tied={tie}"].metrics]
    assert len(layered) == len(plain) == STEPS  # the resumed run's file holds all 10 steps
    worst = max(abs(a - b) for a, b in zip(plain, layered, strict=True))
    print(f"tp 2 x pp 2 (tied={tie}) vs 1 rank: max |dloss| over {STEPS} steps = {worst:.2e}")
    assert worst <= FP32_TOLERANCE
    layout = runs[f"tp_pp/tied={tie}"].summary["layout"]
    expected = {"dp": 1, "tp": 2, "pp": 2, "accum_steps": 4}
    assert {k: layout[k] for k in expected} == expected


@pytest.mark.parametrize("tie", ["true", "false"])
def test_gradient_norm_spans_stages_and_shards(runs, tie):
    """Clipping (grad_clip 1.0) is by the whole model's norm: ladder's at ZeRO-0, DeepSpeed's at ZeRO-1."""
    plain = [m["grad_norm"] for m in runs[f"plain/tied={tie}"].metrics]
    layered = [m["grad_norm"] for m in runs[f"tp_pp/tied={tie}"].metrics]
    assert layered == pytest.approx(plain, rel=1e-4)


def test_noise_scale_sums_stages_and_shards(runs):
    """Untied: each micro-batch's squares over 2 stages x 2 shards, the norms counted once."""
    plain = runs["plain/tied=false"].metrics[-1]["batch/noise_scale"]
    layered = runs["tp_pp/tied=false"].metrics[-1]["batch/noise_scale"]
    assert layered == pytest.approx(plain, rel=1e-4)


def test_each_rank_holds_about_a_quarter_of_the_model_states(runs):
    """Measured: the fullest rank holds 824,576 of 3,229,952 params (0.255), as estimated."""
    full = runs["plain/tied=true"].summary["memory"]["measured"]
    memory = runs["tp_pp/tied=true"].summary["memory"]
    for term in ("params", "grads", "optimizer"):
        ratio = memory["measured"][f"{term}_gb"] / full[f"{term}_gb"]
        print(f"{term}: tp 2 x pp 2 / plain = {ratio:.3f}")
        assert 0.24 < ratio < 0.27, (term, ratio)
    for term, error in memory["rel_error"].items():
        assert error is not None and abs(error) <= 1e-3, (term, memory)


def test_a_rank_builds_only_its_shard_of_its_stage(runs):
    build = runs["tp_pp/tied=true"].summary["model_build"]
    assert build["method"] == "by pipeline stage"
    # Rank 0: the first stage's half of the tied embedding and of its 2 blocks' matrices,
    # its norms whole (runner/parallel/pipeline_tensor.py cuts on the meta device).
    assert build["params"] == 824_320
