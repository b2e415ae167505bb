"""Pipeline parallel keeps the experiment and halves what a rank holds.

fp32 on CPU, 10 steps, global batch 16 as micro 4 x accum 4: one rank without a pipeline
against two pipeline stages (parallel.pp=2, dp 1): the 4 micro-batches are the pipeline's.
And two pipelines side by side (pp 2 x dp 2, 4 ranks started by torchrun, which this
2-core host allows where ladder's local launcher keeps one rank per core).
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
    run_train,
    without,
)

from runner.metrics.phase_clock import PIPELINE_PHASES

pytestmark = pytest.mark.multirank

STEPS = REFERENCE_STEPS
COMMON = [*SMALL_EXPERIMENT, f"train.steps={STEPS}"]
LAYOUTS = {"plain/1x4": ["gpus=1"], "pp2/2x4": ["gpus=2", "parallel.pp=2"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_rank_reference) -> dict[str, TrainResult]:
    """The pipeline trained once for the module's tests, beside the session's one-rank reference."""
    root: Path = tmp_path_factory.mktemp("pipeline")
    result = run_train(*LAYOUTS["pp2/2x4"], *COMMON, run_dir=root / "pp2_2x4")
    assert result.returncode == 0, result.stderr[-3000:]
    return {"plain/1x4": one_rank_reference, "pp2/2x4": result}


def test_pipeline_gives_the_losses_of_the_plain_layout(runs):
    plain, pipe = ([m["loss"] for m in runs[name].metrics] for name in LAYOUTS)
    assert len(plain) == len(pipe) == STEPS
    worst = max(abs(a - b) for a, b in zip(plain, pipe, strict=True))
    print(f"pp=2 vs 1 rank: max |dloss| over {STEPS} steps = {worst:.2e}")
    assert worst <= FP32_TOLERANCE
    assert pipe[-1] < pipe[0] - 0.5  # and it trained


def test_the_tied_embedding_sync_stays_out_of_autograd(runs):
    # DeepSpeed broadcasts the tied weight in place when it builds the stages; recorded by
    # autograd, every backward would warn about it.
    assert "c10d::broadcast_" not in runs["pp2/2x4"].stderr


def test_gradient_norm_spans_all_stages(runs):
    # Clipping (grad_clip 1.0) is by the whole model's norm, as on one rank.
    plain, pipe = ([m["grad_norm"] for m in runs[name].metrics] for name in LAYOUTS)
    assert pipe == pytest.approx(plain, rel=1e-4)


def test_each_rank_holds_about_half_the_model_states(runs):
    """Measured: 2 stages of 2 blocks; the last holds 1,647,872 of 3,229,952 params (0.510)."""
    full = runs["plain/1x4"].summary["memory"]["measured"]
    stage = runs["pp2/2x4"].summary["memory"]["measured"]
    for term in ("params", "grads", "optimizer"):
        ratio = stage[f"{term}_gb"] / full[f"{term}_gb"]
        print(f"{term}: pp=2 / plain = {ratio:.3f}")
        # Half the blocks, plus the tied embedding's copy on the last stage.
        assert 0.49 < ratio < 0.53, (term, ratio)


def test_estimate_matches_the_fullest_stage(runs):
    memory = runs["pp2/2x4"].summary["memory"]
    for term, error in memory["rel_error"].items():
        assert error is not None and abs(error) <= 0.02, (term, memory)


def test_summary_records_the_pipeline(runs):
    summary = runs["pp2/2x4"].summary
    assert summary["layout"]["pp"] == 2 and summary["layout"]["accum_steps"] == 4
    pipeline = summary["pipeline"]
    assert pipeline["blocks_per_stage"] == [2, 2]
    assert pipeline["bubble_fraction_predicted"] == pytest.approx((2 - 1) / 4)
    # The tiny model ties its embedding: the two stages' parts of its gradient do not add in squares.
    assert "model.tie_embeddings=false" in summary["noise_scale"]["unmeasured"]


def test_untied_the_noise_scale_adds_up_over_the_stages(train, one_rank_untied_reference):
    """Each stage's per-micro-batch squares, summed over the pipeline: the one-rank B_simple."""
    pipe = train(*LAYOUTS["pp2/2x4"], *COMMON, "model.tie_embeddings=false")
    assert pipe.returncode == 0, pipe.stderr[-3000:]
    ours, theirs = pipe.summary["noise_scale"], one_rank_untied_reference.summary["noise_scale"]
    assert ours["unmeasured"] is None and ours["updates"] == STEPS
    print(f"noise scale B_simple: pp2 {ours['simple']:.6f}, 1 rank {theirs['simple']:.6f}")
    assert ours["simple"] == pytest.approx(theirs["simple"], rel=1e-4)


def test_the_step_time_splits_into_phases_with_the_stage_to_stage_waits_apart(runs):
    """Each 1F1B instruction is timed under its phase; p2p holds the sends, the receives and their waits."""
    phases = (*PIPELINE_PHASES, "other")
    for m in runs["pp2/2x4"].metrics:
        seconds = {phase: m[f"time/{phase}_s"] for phase in phases}
        assert sum(seconds.values()) == pytest.approx(m["time/step_s"], rel=0.02), seconds
        assert seconds["forward"] > 0 and seconds["backward"] > 0 and seconds["optimizer"] > 0, seconds
        assert seconds["p2p"] > 0, seconds  # rank 0 waits for the last stage's backward
    assert "time/p2p_s" not in runs["plain/1x4"].metrics[-1]
    pipeline = runs["pp2/2x4"].summary["pipeline"]
    bubble = pipeline["bubble_share_of_step_predicted"]
    measured = pipeline["p2p_share_of_step_measured"]
    print(f"pp=2, accum 4: bubble {bubble:.2f} of the step predicted, p2p {measured:.2f} measured")
    assert bubble == pytest.approx(0.25 / 1.25)
    assert 0 < measured < 1


def test_a_run_moves_from_2_stages_to_one_rank_and_back_with_the_plain_runs_losses(runs, tmp_path):
    """The checkpoint crosses pp both ways through DeepSpeed's universal checkpoint.

    pp 2 at ZeRO-1 for 4 steps -> 1 rank at ZeRO-2 (the stages' parameters renamed to the
    plain model's) to step 7 -> pp 2 at ZeRO-1 (read through a view under the pipeline's
    names) to step 10: the plain run's losses throughout, Adam's moments and step included.
    """
    run_dir = tmp_path / "run"
    legs = [
        ["parallel=zero1", "parallel.pp=2", "gpus=2", "train.steps=4"],
        ["parallel=zero2", "gpus=1", "train.steps=7"],
        ["parallel=zero1", "parallel.pp=2", "gpus=2", f"train.steps={STEPS}"],
    ]
    result, resumed_from = run_in_legs(legs, *SMALL_EXPERIMENT, run_dir=run_dir)
    assert resumed_from == [None, 4, 7]
    assert (run_dir / "checkpoints" / "step_00000007_universal_pipeline").is_dir()
    losses = {m["step"]: m["loss"] for m in result.metrics}
    plain = {m["step"]: m["loss"] for m in runs["plain/1x4"].metrics}
    assert sorted(losses) == list(range(STEPS))
    worst = max(abs(losses[step] - plain[step]) for step in range(STEPS))
    print(f"pp 2 -> 1 rank -> pp 2 vs 1 rank uninterrupted: max |dloss| = {worst:.2e}")
    assert worst <= FP32_TOLERANCE


def test_two_pipelines_side_by_side_give_the_losses_of_one_rank(runs, tmp_path):
    """pp 2 x dp 2: each pipeline reads its data-parallel rank's micro-batches, the step is the same."""
    result = run_torchrun(
        "gpus=4",
        "parallel.pp=2",
        "batch.micro_size=2",  # dp 2 x micro 2 x accum 4: the pipeline's 4 micro-batches
        *without(COMMON, "batch.micro_size"),
        nproc=4,
        run_dir=tmp_path / "pp2xdp2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    layout = result.summary["layout"]
    assert {k: layout[k] for k in ("dp", "pp", "accum_steps")} == {"dp": 2, "pp": 2, "accum_steps": 4}
    losses = [m["loss"] for m in result.metrics]
    plain = [m["loss"] for m in runs["plain/1x4"].metrics]
    worst = max(abs(a - b) for a, b in zip(plain, losses, strict=True))
    print(f"pp=2 x dp=2 vs 1 rank: max |dloss| over {STEPS} steps = {worst:.2e}")
    assert worst <= FP32_TOLERANCE
