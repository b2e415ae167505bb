"""DeepSpeed's config dict for every parallel x precision: one pure function writes it."""

import itertools

import pytest

from runner.config import (
    Offload,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    Precision,
    PrecisionConfig,
)
from runner.deepspeed_config import build_deepspeed_config
from runner.layout import resolve_layout

pytestmark = pytest.mark.unit

LAYOUT = resolve_layout(gpus=2, tp=1, pp=1, global_size=16, micro_size=4)


@pytest.mark.parametrize(("stage", "precision"), list(itertools.product([0, 1, 2, 3], list(Precision))))
def test_every_parallel_and_precision(stage, precision):
    config = build_deepspeed_config(
        layout=LAYOUT,
        parallel=ParallelConfig(name=f"zero{stage}", zero_stage=stage),
        precision=PrecisionConfig(name=precision),
        optimizer=OptimizerConfig(),
        lr=1e-3,
    )
    assert config["train_batch_size"] == 16
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 2
    assert config["zero_optimization"]["stage"] == stage
    assert config.get("bf16", {}).get("enabled", False) == (precision == Precision.bf16)
    assert config.get("fp16", {}).get("enabled", False) == (precision == Precision.fp16)
    assert config["optimizer"]["type"] == "AdamW"
    assert config["optimizer"]["params"]["lr"] == 1e-3
    assert "auto" not in repr(config)


def test_deepspeed_accepts_the_dict():
    """DeepSpeed's own config parser validates the nested sections strictly."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    for stage in range(4):
        config = build_deepspeed_config(
            layout=LAYOUT,
            parallel=ParallelConfig(
                zero_stage=stage, offload_optimizer=Offload.cpu if stage else Offload.none
            ),
            precision=PrecisionConfig(name=Precision.bf16),
            optimizer=OptimizerConfig(),
            lr=1e-3,
        )
        DeepSpeedZeroConfig(**config["zero_optimization"])


def test_sgd_and_offload():
    config = build_deepspeed_config(
        layout=LAYOUT,
        parallel=ParallelConfig(zero_stage=2, offload_optimizer=Offload.cpu),
        precision=PrecisionConfig(),
        optimizer=OptimizerConfig(name=OptimizerName.sgd, momentum=0.8),
        lr=0.1,
    )
    assert config["optimizer"] == {
        "type": "SGD",
        "params": {"lr": 0.1, "momentum": 0.8, "weight_decay": 0.1, "fused": True},
    }
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    # ZeRO steps SGD only when told it may (DeepSpeed asserts on optimizers outside its Adam list).
    assert config["zero_allow_untested_optimizer"] is True
