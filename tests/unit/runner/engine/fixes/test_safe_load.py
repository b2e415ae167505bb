"""Checkpoint files are unpickled weights-only: a doctored one is refused, not run
(runner/engine/fixes/pickle_in_checkpoints.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from runner.engine.fixes import pickle_in_checkpoints as safe_load

pytestmark = pytest.mark.unit


class Payload:
    """What an attacker pickles: unpickling it calls os.mkdir(marker)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _doctored(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "code-ran"
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(2)}, "extra": Payload(marker)}, path)
    return path, marker


def test_the_payload_runs_under_a_plain_load(tmp_path):
    path, marker = _doctored(tmp_path)
    torch.load(path, weights_only=False)  # what DeepSpeed 0.19.8 does with its files
    assert marker.is_dir()


def test_a_doctored_file_is_refused_before_its_code_runs(tmp_path):
    path, marker = _doctored(tmp_path)
    refused = safe_load.UnsafeCheckpointError
    with pytest.raises(refused, match=r"refused to load .*mp_rank_00_model_states\.pt"):
        safe_load.load(path)
    with safe_load.weights_only_loads(), pytest.raises(refused, match=r"GLOBAL posix\.mkdir"):
        torch.load(path, weights_only=False)  # DeepSpeed's direct loads are held to weights-only
    assert not marker.exists()
    assert torch.load is not safe_load._forced_load  # the hold ends with the block


def test_deepspeed_types_and_tensors_load(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    path = tmp_path / "optim_states.pt"
    # ZeRO in fp16 pickles its DynamicLossScaler (a checkpoint of it was refused as doctored once).
    dynamic = DynamicLossScaler(2.0**15, 1000, min_scale=1, delayed_shift=1, consecutive_hysteresis=False)
    state = {
        "zero_stage": ZeroStageEnum.gradients,
        "loss_scaler": LossScaler(1.0),
        "fp16_loss_scaler": dynamic,
        "t": torch.ones(3),
    }
    torch.save(state, path)
    state = safe_load.load(path)
    assert state["zero_stage"] == ZeroStageEnum.gradients
    assert isinstance(state["loss_scaler"], LossScaler)
    assert isinstance(state["fp16_loss_scaler"], DynamicLossScaler)
    assert state["fp16_loss_scaler"].cur_scale == 2.0**15
    assert torch.equal(state["t"], torch.ones(3))
