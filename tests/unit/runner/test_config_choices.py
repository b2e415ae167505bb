"""The facts a precision and a ZeRO stage carry, stated once (runner/config_choices.py) for every
estimator and rank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from runner.config import Precision, ZeroStage
from runner.hardware.peak_flops import torch_dtype
from runner.step_time.measured.figures import precision_of

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("precision", "element_bytes", "dtype"),
    [
        (Precision.fp32, 4, torch.float32),
        (Precision.bf16, 2, torch.bfloat16),
        (Precision.fp16, 2, torch.float16),
    ],
)
def test_a_precision_says_its_element_bytes_and_torch_dtype(precision, element_bytes, dtype):
    assert (precision.bytes, precision.torch_dtype) == (element_bytes, dtype)
    assert precision.torch_dtype_name == str(dtype).removeprefix("torch.")
    assert precision_of(precision.torch_dtype_name) is precision
    assert torch.tensor([], dtype=dtype).element_size() == element_bytes
    assert torch_dtype(precision.value) is dtype and torch_dtype(dtype) is dtype
    with pytest.raises(ValueError, match="one of fp32, bf16, fp16"):
        torch_dtype("fp8")


@pytest.mark.parametrize("stage", list(ZeroStage))
def test_a_zero_stage_shards_what_deepspeed_partitions_at_it(stage):
    """Each property gives DeepSpeed 0.19.8's own answer for the stage: its config turns ZeRO's
    optimizer on (``zero_enabled``), its engine partitions the gradients and the weights."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine

    config = DeepSpeedConfig({"train_batch_size": 1, "zero_optimization": {"stage": int(stage)}})
    engine = SimpleNamespace(zero_optimization_stage=lambda: int(stage))
    assert (stage.shards_optimizer_states, stage.shards_gradients, stage.shards_parameters) == (
        config.zero_enabled,
        DeepSpeedEngine.zero_optimization_partition_gradients(engine),
        DeepSpeedEngine.zero_optimization_partition_weights(engine),
    )
