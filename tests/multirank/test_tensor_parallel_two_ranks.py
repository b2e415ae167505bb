"""Tensor parallel keeps the experiment and halves the block matrices each rank holds.

fp32 on CPU, tiny model, global batch 16, 10 steps at lr 1e-3: ``parallel=tp2`` (ZeRO-1 +
AutoTP over 2 ranks, dp 1) against one plain rank. Measured here: the losses agree within
9.5e-7; each rank holds 0.500x the plain run's parameters, gradients and optimizer states
(the output head and the embedding tied to it split by vocabulary, the norms whole), and
the estimate matches each term within 1e-6 relative.
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
    short_run,
    without,
)

pytestmark = pytest.mark.multirank

STEPS = REFERENCE_STEPS
COMMON = [*SMALL_EXPERIMENT, f"train.steps={STEPS}"]
STATES = ("params", "grads", "optimizer")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_rank_reference) -> dict[str, TrainResult]:
    """One plain rank (the session's reference) and a tp 2 pair, trained once for the module's tests."""
    root: Path = tmp_path_factory.mktemp("tp")
    result = run_train("parallel=tp2", "gpus=2", *COMMON, run_dir=root / "tp2")
    assert result.returncode == 0, result.stderr[-3000:]
    return {"plain": one_rank_reference, "tp2": result}


def test_layout_is_tensor_parallel(runs):
    layout = runs["tp2"].summary["layout"]
    assert (layout["gpus"], layout["tp"], layout["dp"], layout["accum_steps"]) == (2, 2, 1, 4)


def test_losses_and_grad_norms_match_the_plain_run(runs):
    plain, tp = runs["plain"].metrics, runs["tp2"].metrics
    assert len(plain) == len(tp) == STEPS
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(plain, tp, strict=True))
    print(f"tp2 vs 1 rank: max |dloss| over {STEPS} steps = {worst:.2e}")
    assert worst <= FP32_TOLERANCE
    # The reported norm is the whole model's, not one rank's shards (clipping at 1.0 acts on it).
    for a, b in zip(plain, tp, strict=True):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert plain[-1]["loss"] < plain[0]["loss"] - 0.5


def test_the_noise_scale_is_the_whole_models(runs):
    """Each micro-batch's shard norms are summed over the tp group: B_simple is the plain run's."""
    plain, tp = runs["plain"].summary["noise_scale"], runs["tp2"].summary["noise_scale"]
    assert tp["unmeasured"] is None and tp["updates"] == STEPS
    print(f"noise scale B_simple: tp2 {tp['simple']:.6f}, 1 rank {plain['simple']:.6f}")
    assert tp["simple"] == pytest.approx(plain["simple"], rel=1e-4)


def test_each_rank_holds_about_half_the_model_states(runs):
    full = runs["plain"].summary["memory"]["measured"]
    split = runs["tp2"].summary["memory"]["measured"]
    ratios = {term: split[f"{term}_gb"] / full[f"{term}_gb"] for term in STATES}
    print("measured per rank, tp2 / plain: " + ", ".join(f"{t} {r:.3f}" for t, r in ratios.items()))
    for term, ratio in ratios.items():
        # Half of the block matrices and of the tied embedding-head, the norms whole: 0.5004.
        assert 0.5 < ratio < 0.501, term


def test_estimate_matches_the_measurement(runs):
    memory = runs["tp2"].summary["memory"]
    for term, tolerance in {**dict.fromkeys(STATES, 0.02), "activations": 0.15}.items():
        error = memory["rel_error"][term]
        assert error is not None and abs(error) <= tolerance, (term, memory)


def test_a_run_moves_from_tp_2_to_one_rank_and_back_with_the_plain_runs_losses(runs, tmp_path):
    """The checkpoint crosses tp and ZeRO stages through DeepSpeed's universal checkpoint.

    tp 2 at ZeRO-1 for 4 steps -> tp 2 at ZeRO-3 (each rank loads its slice) to step 7 -> 1
    rank at ZeRO-2 (ZeRO-3's shards joined) to step 10: the plain run's losses throughout, the
    Adam moments and step included (without them the gap is 1e-2 and more).
    """
    run_dir = tmp_path / "run"
    legs = [
        ["parallel=tp2", "gpus=2", "train.steps=4"],
        ["parallel=zero3", "parallel.tp=2", "gpus=2", "train.steps=7"],
        ["parallel=zero2", "gpus=1", f"train.steps={STEPS}"],
    ]
    result, resumed_from = run_in_legs(legs, *SMALL_EXPERIMENT, run_dir=run_dir)
    assert resumed_from == [None, 4, 7]
    assert (run_dir / "checkpoints" / "step_00000007_universal").is_dir()
    losses = {m["step"]: m["loss"] for m in result.metrics}
    plain = {m["step"]: m["loss"] for m in runs["plain"].metrics}
    assert sorted(losses) == list(range(STEPS))
    worst = max(abs(losses[step] - plain[step]) for step in range(STEPS))
    print(f"tp 2 -> tp 2 at ZeRO-3 -> 1 rank vs 1 rank uninterrupted: max |dloss| = {worst:.2e}")
    assert worst <= FP32_TOLERANCE


def test_bf16_ddp_at_tp_2_clips_by_the_whole_models_gradient_norm(trained_once):
    """bf16 at stage 0 is DeepSpeed's FP16_UnfusedOptimizer, whose own norm sees one rank's shards
    (13.6 where the model's is 18.75, tiny, step 0): ladder hands it the whole model's
    (runner/engine/fixes/unfused_clip_norm.py). Against the memory ledger's bf16 run on one rank."""
    tp2 = trained_once(*short_run("ddp", 2, "bf16"), "parallel.tp=2")
    plain = trained_once(*short_run("ddp", 1, "bf16"))
    assert tp2.summary["layout"]["tp"] == 2
    for a, b in zip(plain.metrics, tp2.metrics, strict=True):
        print(f"grad norm: 1 rank {a['grad_norm']:.4f}, tp 2 {b['grad_norm']:.4f}")
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-2)
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-3)  # bf16: layouts agree to about 1e-4


def test_zero3_bf16_with_tp_keeps_the_ledger(train):
    """ZeRO-3 shards the tp shards over dp; AutoTP's saved weight views are not activations.

    Untied, so the token embedding is split apart from the head (runner/parallel/tensor.py
    ``split_token_embedding``), from zero.Init's partitions.
    """
    result = train(
        "parallel=zero3",
        "parallel.tp=2",
        "gpus=2",
        "precision=bf16",
        "model.tie_embeddings=false",
        "train.steps=2",
        "logger=none",
        "data.seq_len=64",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    memory = result.summary["memory"]
    for term, tolerance in {**dict.fromkeys(STATES, 0.02), "activations": 0.15}.items():
        error = memory["rel_error"][term]
        assert error is not None and abs(error) <= tolerance, (term, memory)


def test_zero3_with_tp_builds_partitions_over_the_data_parallel_group(runs, tmp_path):
    """tp 2 x dp 2 at ZeRO-3: each rank builds 1/dp of the model under zero.Init, AutoTP cuts the shards.

    Measured: rank 0 builds 1,614,976 of 3,229,952 parameters (the whole build held them all),
    and the losses match the plain run's as closely as tp 2 alone does.
    """
    result = run_torchrun(
        "gpus=4",
        "parallel=zero3",
        "parallel.tp=2",
        "batch.micro_size=2",  # dp 2 x micro 2 x accum 4: the plain run's 16 sequences a step
        *without(COMMON, "batch.micro_size"),
        nproc=4,
        run_dir=tmp_path / "zero3_tp2_dp2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    build = result.summary["model_build"]
    assert build["method"] == "partitioned by zero.Init"
    assert build["params"] == -(-build["num_params"] // 2)
    plain = runs["plain"].metrics
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(plain, result.metrics, strict=True))
    print(f"zero3 tp 2 x dp 2 vs 1 rank: max |dloss| over {STEPS} steps = {worst:.2e}")
    assert worst <= FP32_TOLERANCE
    memory = result.summary["memory"]
    for term in STATES:
        assert abs(memory["rel_error"][term]) <= 0.02, (term, memory)
