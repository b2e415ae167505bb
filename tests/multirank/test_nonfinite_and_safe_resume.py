"""A NaN step skipped at ZeRO-3 and resumed; a doctored checkpoint refused on resume, its code never run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from checkpoint_states import checkpoint_tensors, max_abs_diff
from train_helpers import injecting, run_train

pytestmark = pytest.mark.multirank

COMMON = ["batch.global_size=16", "logger=none", "data.seq_len=64"]


def test_zero3_skips_a_nan_step_and_a_resume_keeps_the_count(tmp_path):
    run_dir = tmp_path / "run"
    args = ["gpus=2", "parallel=zero3", "batch.micro_size=4", "train.on_nonfinite=skip", *COMMON]
    first = run_train(
        *args,
        "train.steps=3",
        "train.checkpoint_every=1",
        "train.keep_checkpoints=3",
        run_dir=run_dir,
        env=injecting(LADDER_INJECT_NAN="0:1"),
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.summary["skipped_steps"]["steps"] == [1]
    # ZeRO-3 partitions of the weights and of Adam's state: unchanged by the skipped step.
    before, after = checkpoint_tensors(run_dir, "step_00000001"), checkpoint_tensors(run_dir, "step_00000002")
    assert max_abs_diff(before, after) == 0.0
    assert max_abs_diff(after, checkpoint_tensors(run_dir, "step_00000003")) > 0.0

    resumed = run_train(*args, "train.steps=4", "train.resume=auto", run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.summary["resumed_from_step"] == 3
    assert resumed.summary["skipped_steps"] == {"policy": "skip", "count": 1, "steps": [1]}


def test_a_pipeline_checks_the_loss_before_its_optimizer_step(tmp_path):
    """pp 2: the last stage's NaN loss is voted on inside DeepSpeed's schedule, before the update."""
    args = ["gpus=2", "parallel=pp2", "batch.micro_size=4", "train.checkpoint_every=1", *COMMON]
    nan_at_step_1 = injecting(LADDER_INJECT_NAN="1:1")  # rank 1: the last stage, which forms the loss
    skip_dir = tmp_path / "skip"
    skipped = run_train(
        *args,
        "train.on_nonfinite=skip",
        "train.steps=3",
        "train.keep_checkpoints=3",
        run_dir=skip_dir,
        env=nan_at_step_1,
    )
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert skipped.summary["skipped_steps"]["steps"] == [1]
    # Both stages' weights and Adam's state: unchanged by the skipped step, moved by the next.
    before, after = (
        checkpoint_tensors(skip_dir, "step_00000001"),
        checkpoint_tensors(skip_dir, "step_00000002"),
    )
    assert max_abs_diff(before, after) == 0.0
    assert max_abs_diff(after, checkpoint_tensors(skip_dir, "step_00000003")) > 0.0

    stopped = run_train(*args, "train.steps=3", run_dir=tmp_path / "stop", env=nan_at_step_1)
    assert stopped.returncode == 1
    assert "FloatingPointError: loss is nan at step 1" in stopped.summary["error"]
    assert sorted(p.name for p in (tmp_path / "stop" / "checkpoints").glob("step_*")) == ["step_00000001"]


class Payload:
    """Unpickling it calls os.mkdir(marker): what a doctored checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_doctored_checkpoint_is_refused_and_its_code_never_runs(tmp_path):
    run_dir = tmp_path / "run"
    args = ["batch.micro_size=8", "train.checkpoint_every=2", *COMMON]
    first = run_train(*args, "train.steps=2", run_dir=run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    states = run_dir / "checkpoints" / "step_00000002" / "mp_rank_00_model_states.pt"
    doctored = torch.load(states, weights_only=False)
    marker = tmp_path / "code-ran"
    doctored["payload"] = Payload(marker)
    torch.save(doctored, states)

    resumed = run_train(*args, "train.steps=4", "train.resume=auto", run_dir=run_dir)
    assert resumed.returncode == 1
    assert not marker.exists()
    error = resumed.summary["error"]
    assert "UnsafeCheckpointError" in error and "mp_rank_00_model_states.pt" in error
    assert "posix.mkdir" in error and "Delete that checkpoint" in error
