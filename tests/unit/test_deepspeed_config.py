"""DeepSpeed's config dict for every parallel x precision: one pure function writes it."""

import itertools

import pytest
from train_helpers import compose_config

from runner.config import (
    ModelConfig,
    Offload,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    Precision,
    PrecisionConfig,
)
from runner.engine.deepspeed_config import build_deepspeed_config, reduce_bucket_elements
from runner.layout import resolve_layout

pytestmark = pytest.mark.unit

LAYOUT = resolve_layout(gpus=2, tp=1, pp=1, global_size=16, micro_size=4)


@pytest.mark.parametrize(("stage", "precision"), list(itertools.product([0, 1, 2, 3], list(Precision))))
def test_every_parallel_and_precision(stage, precision):
    config = build_deepspeed_config(
        layout=LAYOUT,
        model=ModelConfig(),
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
    # fp16: every stage halves the loss scale at each overflow (stage 0's optimizer knows no
    # hysteresis), and stage 0 divides by dp before its all-reduce, as ZeRO does.
    assert config.get("fp16", {}).get("hysteresis", 1) == 1
    assert config.get("fp16", {}).get("loss_scale_window", 1000) == 1000  # precision.loss_scale_window
    assert config.get("prescale_gradients", False) == (precision == Precision.fp16 and stage == 0)
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
            model=ModelConfig(),
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
        model=ModelConfig(),
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


def test_the_gradient_bucket_is_never_larger_than_the_model():
    """DeepSpeed's 5e8-element bucket (2 GB in fp32) shrinks to a model that could never fill it."""
    names = ("tiny", "gpt2_124m", "llama_1b")
    tiny, gpt2, llama_1b = (compose_config(f"model={name}").model for name in names)
    default = ParallelConfig(name="zero3", zero_stage=3).reduce_bucket_size
    assert reduce_bucket_elements(default, tiny) == 3_229_952  # the tiny model's parameters
    assert reduce_bucket_elements(default, gpt2) == 123_551_232
    assert reduce_bucket_elements(default, llama_1b) == 500_000_000  # larger models keep the default
    assert reduce_bucket_elements(200_000, tiny) == 200_000  # a smaller bucket is the user's choice
    config = build_deepspeed_config(
        layout=LAYOUT,
        model=tiny,
        parallel=ParallelConfig(name="zero3", zero_stage=3),
        precision=PrecisionConfig(),
        optimizer=OptimizerConfig(),
        lr=1e-3,
    )
    assert config["zero_optimization"]["reduce_bucket_size"] == 3_229_952
