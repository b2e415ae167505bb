"""A sequence-parallel run's checkpoint resumes on another layout, and one run on another resumes
under sequence parallelism: the uninterrupted losses either way.

Its ZeRO files are cut over the sequence and data ranks together (runner/layout.py zero_ranks)
and its model-state file says tp 1 (runner/engine/fixes/sequence_parallel_checkpoint_dims.py:
DeepSpeed wrote sp there, and its universal conversion refused the checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import FP32_TOLERANCE, SMALL_EXPERIMENT, TrainResult, run_in_legs

pytestmark = pytest.mark.multirank


def _losses(run_dir: Path) -> dict[int, float]:
    return {
        m["step"]: m["loss"] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    }


def test_sequence_parallel_zero1_to_one_rank_and_back_to_sequence_parallel_zero3(
    tmp_path, one_rank_reference: TrainResult
):
    run_dir = tmp_path / "run"
    legs = [
        ["gpus=2", "parallel=zero1", "parallel.sp=2", "train.steps=3"],
        ["gpus=1", "parallel=ddp", "train.steps=6"],
        ["gpus=2", "parallel=zero3", "parallel.sp=2", "train.steps=10"],
    ]
    last, resumed_from = run_in_legs(legs, *SMALL_EXPERIMENT, run_dir=run_dir)
    assert resumed_from == [None, 3, 6]
    history = [(seg["from_step"], seg["parallel"], seg["dp"]) for seg in last.summary["layout_history"]]
    assert history == [(0, "zero1", 1), (3, "ddp", 1), (6, "zero3", 1)]
    losses, expected = _losses(run_dir), _losses(one_rank_reference.run_dir)
    assert sorted(losses) == sorted(expected)
    for step in expected:
        assert losses[step] == pytest.approx(expected[step], abs=FP32_TOLERANCE), step
