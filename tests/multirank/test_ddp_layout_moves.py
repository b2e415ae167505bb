"""parallel=ddp changes layout as the ZeRO stages do: its checkpoint crosses to ZeRO 1-3 and back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from train_helpers import (
    FP32_TOLERANCE,
    SHORT_RUN,
    SMALL_EXPERIMENT,
    TrainResult,
    compose_config,
    run_in_legs,
    run_train,
    without,
)

from runner.checkpoint import stage0 as checkpoint_stage0
from runner.checkpoint import universal_conversion as checkpoint
from runner.engine.fixes import pickle_in_checkpoints as safe_load

pytestmark = pytest.mark.multirank

TAG = "step_00000002"
# bf16 layouts agree to about this (tests/multirank/test_layout_invariance.py says why).
BF16_TOLERANCE = 1e-3


def _losses(run_dir: Path) -> dict[int, float]:
    return {
        m["step"]: m["loss"] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    }


def test_ddp_on_2_ranks_to_zero3_to_ddp_on_1_gives_the_uninterrupted_losses(
    tmp_path, one_rank_reference: TrainResult
):
    """Weights, Adam moments and step, LR schedule and data position cross from stage 0 into
    ZeRO-3 (ladder writes the universal checkpoint) and from ZeRO-3 back into stage 0 (ladder
    writes the stage-0 file from the universal one), at another dp each time."""
    run_dir = tmp_path / "run"
    legs = [
        ["gpus=2", "parallel=ddp", "train.steps=3"],
        ["gpus=2", "parallel=zero3", "train.steps=6"],
        ["gpus=1", "parallel=ddp", "train.steps=10"],
    ]
    last, resumed_from = run_in_legs(legs, *SMALL_EXPERIMENT, run_dir=run_dir)
    assert resumed_from == [None, 3, 6]
    assert last.summary["status"] == "completed"
    history = [(seg["from_step"], seg["parallel"], seg["dp"]) for seg in last.summary["layout_history"]]
    assert history == [(0, "ddp", 2), (3, "zero3", 2), (6, "ddp", 1)]
    said = re.search(
        r"layouts: ddp on 2 \(dp 2\) from step 0 -> zero3 on 2 \(dp 2\) from step 3 (.*) -> ddp on 1",
        last.stdout,
    )
    assert said is not None, last.stdout
    assert re.fullmatch(r"\(converted in \d+\.\d s, [\d.,]+ MB\)", said.group(1)), said.group(1)
    checkpoints = run_dir / "checkpoints"
    # Step 3's checkpoint and its conversion are pruned by then (train.keep_checkpoints=2).
    assert (checkpoints / "step_00000006_universal_ddp" / checkpoint_stage0.MODEL_STATES).is_file()
    losses, expected = _losses(run_dir), _losses(one_rank_reference.run_dir)
    assert sorted(losses) == sorted(expected)
    for step in expected:  # without the Adam moments or step the gap is 1e-2 and more
        assert losses[step] == pytest.approx(expected[step], abs=FP32_TOLERANCE), step


def test_ddp_crosses_pipeline_and_tensor_parallel_cuts_and_zero2_with_the_uninterrupted_losses(
    tmp_path, one_rank_reference: TrainResult
):
    """fp32 ``ddp`` at pp 2, 1 rank at ZeRO-2, ``ddp`` at tp 2, at tp 2 x pp 2 (4 ranks, by
    torchrun), 1 rank at ZeRO-2 again, ``ddp`` at pp 2 again: every stage-0 cut's checkpoint
    crosses into the universal format and back out of it. ladder joins a pipeline's stage files
    (each stage's layers and Adam state), a tensor-parallel rank's shards (row-parallel weights
    along their inputs, the rest along dimension 0, the norms whole), and both at once, stage by
    stage (model-parallel rank ``stage * tp + tp_rank`` wrote each stage's shards); it slices the
    universal checkpoint for tp 2 by AutoTP's record of each shard, under each stage's names at
    tp 2 x pp 2, and writes the stages' own files for pp 2. DeepSpeed's ZeRO-2 loads what ladder
    joined, and ladder reads what DeepSpeed converted."""
    run_dir = tmp_path / "run"
    pp2, tp2 = ["gpus=2", "parallel=ddp", "parallel.pp=2"], ["gpus=2", "parallel=ddp", "parallel.tp=2"]
    legs = [
        [*pp2, "train.steps=2"],
        ["gpus=1", "parallel=zero2", "train.steps=4"],
        [*tp2, "train.steps=5"],
        ["gpus=4", "parallel=ddp", "parallel.tp=2", "parallel.pp=2", "train.steps=7"],
        ["gpus=1", "parallel=zero2", "train.steps=8"],
        [*pp2, "train.steps=10"],
    ]
    _, resumed_from = run_in_legs(legs, *SMALL_EXPERIMENT, run_dir=run_dir)
    assert resumed_from == [None, 2, 4, 5, 7, 8]
    losses, expected = _losses(run_dir), _losses(one_rank_reference.run_dir)
    assert sorted(losses) == sorted(expected)
    worst = max(abs(losses[step] - expected[step]) for step in expected)
    print(f"ddp pp 2 -> zero2 -> tp 2 -> tp 2 x pp 2 -> zero2 -> pp 2 vs 1 rank: max |dloss| = {worst:.2e}")
    assert worst <= FP32_TOLERANCE  # without the Adam moments or step the gap is 1e-2 and more
    stage_files = run_dir / "checkpoints" / "step_00000008_universal_ddp"
    assert {path.name for path in stage_files.glob("mp_rank_*")} == {
        "mp_rank_00_model_states.pt",
        "mp_rank_01_model_states.pt",
    }


# bf16 on a CPU without bf16 kernels is slow: tiny at half its width (d_model 128).
BF16 = [*without(SHORT_RUN, "train.steps"), "precision=bf16", "model.d_model=128", "model.ffn_hidden=344"]
PP2 = ["gpus=2", "parallel=ddp", "parallel.pp=2"]


@pytest.fixture(scope="module")
def bf16_pipeline(tmp_path_factory) -> TrainResult:
    """bf16 at pp 2 for 8 steps, uninterrupted: the bf16 moves' reference."""
    result = run_train(*PP2, *BF16, "train.steps=8", run_dir=tmp_path_factory.mktemp("bf16") / "pp2")
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_a_bf16_stage0_checkpoint_at_tp_2_and_pp_2_moves_and_comes_back(tmp_path, bf16_pipeline):
    """bf16 at tp 2 x pp 2 is BF16_Optimizer on each of 4 model-parallel ranks: to 1 rank at
    ZeRO-1 after step 2 and back after step 3, within bf16's spread of the uninterrupted run
    at pp 2."""
    cut = ["gpus=4", "parallel=ddp", "parallel.tp=2", "parallel.pp=2"]
    legs = [[*cut, "train.steps=2"], ["gpus=1", "parallel=zero1", "train.steps=3"], [*cut, "train.steps=4"]]
    _, resumed_from = run_in_legs(legs, *BF16, run_dir=tmp_path / "run")
    assert resumed_from == [None, 2, 3]
    losses, expected = _losses(tmp_path / "run"), _losses(bf16_pipeline.run_dir)
    assert sorted(losses) == list(range(4))
    worst = max(abs(losses[step] - expected[step]) for step in range(4))
    print(f"bf16 tp 2 x pp 2 -> zero1 on 1 -> back vs pp 2 uninterrupted: max |dloss| = {worst:.2e}")
    assert worst <= BF16_TOLERANCE


def test_a_bf16_pipelines_stage0_checkpoint_resumes_and_moves(tmp_path, bf16_pipeline):
    """bf16 under a pipeline is DeepSpeed's BF16_Optimizer, which 0.19.8's engine cannot hand its
    own state at stage 0 (ladder loads it): pp 2 resumes at step 2 with the uninterrupted run's
    losses to the bit, moves to 1 rank at ZeRO-1 at step 4 and back to pp 2 at step 6."""
    # The ledger names the gradient buffer BF16_Optimizer keeps beside the parameters' gradients.
    memory = bf16_pipeline.summary["memory"]
    assert all(abs(error) <= 0.02 for error in memory["rel_error"].values()), memory["rel_error"]
    buffer = "non_expert_gradients_gb"
    measured, estimated = memory["measured"]["residual"][buffer], memory["estimated"]["residual"][buffer]
    assert measured == pytest.approx(estimated, rel=0.02)
    run_dir = tmp_path / "run"
    legs = [
        [*PP2, "train.steps=2"],
        [*PP2, "train.steps=4"],
        ["gpus=1", "parallel=zero1", "train.steps=6"],
        [*PP2, "train.steps=8"],
    ]
    _, resumed_from = run_in_legs(legs, *BF16, run_dir=run_dir)
    assert resumed_from == [None, 2, 4, 6]
    losses, expected = _losses(run_dir), _losses(bf16_pipeline.run_dir)
    assert sorted(losses) == sorted(expected) == list(range(8))
    assert [losses[step] for step in range(4)] == [expected[step] for step in range(4)]
    worst = max(abs(losses[step] - expected[step]) for step in range(4, 8))
    print(f"bf16 pp 2 -> zero1 on 1 -> pp 2 vs pp 2 uninterrupted, steps 4-7: max |dloss| = {worst:.2e}")
    assert worst <= BF16_TOLERANCE


def _saved(tmp_path: Path, *overrides: str) -> Path:
    """A 2-step run on 1 rank that checkpoints at its end; returns the checkpoint's folder."""
    run_dir = tmp_path / "_".join(o.split("=")[1] for o in overrides)
    result = run_train(*overrides, "gpus=1", "train.checkpoint_every=2", *SHORT_RUN, run_dir=run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir / "checkpoints" / TAG


def _files(universal: Path) -> dict[str, object]:
    """Each per-parameter file of a universal checkpoint: its keys and its tensor."""
    found: dict[str, object] = {}
    for path in sorted((universal / "zero").glob("*/*.pt")):
        loaded = safe_load.load(path)
        found[f"{path.parent.name}/{path.name}"] = loaded
    return found


def test_ladders_stage0_conversion_writes_what_deepspeed_writes_for_zero1(tmp_path):
    """The same experiment on 1 rank at stage 0 and at ZeRO-1, fp32: ladder's universal form of
    the first has the files, keys and shapes of DeepSpeed's of the second, and their values
    (1 rank: the same sums) within fp32 rounding; a parameter named for another's position
    would be off by the whole weight."""
    model = compose_config("model=tiny").model
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    checkpoint_stage0.to_universal(_saved(tmp_path, "parallel=ddp", "precision=fp32"), ours, model)
    zero1 = {"tag": TAG, "layout": {"dp": 1, "gpus": 1}, "zero_stage": 1}  # named if it fails
    checkpoint._ds_to_universal(_saved(tmp_path, "parallel=zero1", "precision=fp32"), theirs, zero1)
    mine, deepspeeds = _files(ours), _files(theirs)
    assert mine.keys() == deepspeeds.keys()
    for name, fragment in mine.items():
        other = deepspeeds[name]
        if torch.is_tensor(fragment):  # step.pt
            assert torch.equal(fragment, other), name
            continue
        assert isinstance(fragment, dict) and isinstance(other, dict)
        assert fragment.keys() == other.keys(), name
        assert fragment["param"].shape == other["param"].shape, name
        assert torch.allclose(fragment["param"], other["param"], rtol=0, atol=1e-6), name


def test_a_bf16_stage0_checkpoint_crosses_the_universal_format_and_back_bit_for_bit(tmp_path):
    """bf16 at stage 0 keeps fp32 masters beside the bf16 weights (FP16_UnfusedOptimizer): the
    stage-0 file written back from ladder's universal form equals the original, every tensor."""
    model = compose_config("model=tiny").model
    source = _saved(tmp_path, "parallel=ddp", "precision=bf16")
    universal, back = tmp_path / "universal", tmp_path / "back"
    universal.mkdir()
    checkpoint_stage0.to_universal(source, universal, model)
    checkpoint_stage0.from_universal(universal, back, model, compose_config("precision=bf16").precision.name)
    original = safe_load.load(source / checkpoint_stage0.MODEL_STATES)
    written = safe_load.load(back / checkpoint_stage0.MODEL_STATES)
    flat_original, flat_written = _flatten(original), _flatten(written)
    assert flat_original.keys() == flat_written.keys()
    for key, value in flat_original.items():
        if torch.is_tensor(value):
            assert value.dtype == flat_written[key].dtype and torch.equal(value, flat_written[key]), key
        else:
            assert value == flat_written[key], key


def _flatten(obj: object, prefix: str = "") -> dict[str, object]:
    items: list[tuple[object, object]] = []
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    else:
        return {prefix: obj}
    found: dict[str, object] = {}
    for key, value in items:
        found.update(_flatten(value, f"{prefix}/{key}"))
    return found
