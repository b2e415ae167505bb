"""DeepSpeed's config dict for every parallel x precision: one pure function writes it."""

import dataclasses
import itertools

import pytest
from train_helpers import compose_config

from launchers.overrides import override_problems
from launchers.prelaunch import deepspeed_config_for
from runner.config import (
    ModelConfig,
    Offload,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    Precision,
    PrecisionConfig,
    ZeroStage,
)
from runner.engine.deepspeed_config import build_deepspeed_config, reduce_bucket_elements
from runner.errors import ConfigError
from runner.layout import resolve_layout
from runner.model.shape import num_params
from runner.plan.planner import knobs_from_config, layout_for_config
from runner.preflight.validate import validate

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


@pytest.mark.parametrize("overlap_comm", [None, False, True])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_reduction_overlaps_backward_as_deepspeed_defaults_it(stage, overlap_comm):
    """parallel.overlap_comm=null (the default) is DeepSpeed's own choice: on at ZeRO-3, off below;
    a value set wins. The plan prices the reduction with the same answer."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    option = ZeroStage(stage).name  # the conf/parallel option of this stage
    parallel = ParallelConfig(name=option, zero_stage=stage, overlap_comm=overlap_comm)
    written = build_deepspeed_config(
        layout=LAYOUT,
        model=ModelConfig(),
        parallel=parallel,
        precision=PrecisionConfig(),
        optimizer=OptimizerConfig(),
        lr=1e-3,
    )["zero_optimization"]
    unset = {key: value for key, value in written.items() if key != "overlap_comm"}
    deepspeeds_own = DeepSpeedZeroConfig(**unset).overlap_comm
    expected = deepspeeds_own if overlap_comm is None else overlap_comm
    assert written["overlap_comm"] is expected
    assert deepspeeds_own is (stage == 3)
    value = "null" if overlap_comm is None else str(overlap_comm).lower()
    plan_knobs = knobs_from_config(compose_config(f"parallel={option}", f"parallel.overlap_comm={value}"))
    assert plan_knobs.spec.overlap_comm is expected


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


def _zero_section(*overrides: str) -> dict:
    """The ``zero_optimization`` section of the deepspeed_config.json a run of these overrides writes."""
    config = compose_config("gpus=8", "batch.global_size=8", "batch.micro_size=1", *overrides)
    return deepspeed_config_for(config, layout_for_config(config).layout)["zero_optimization"]


# model: (h, stage3_prefetch_bucket_size int(0.9 h^2), stage3_param_persistence_threshold 10h):
# Hugging Face's DeepSpeed integration's "auto" (transformers integrations/deepspeed.py
# HfTrainerDeepSpeedConfig.trainer_config_finalize).
DERIVED = {
    "tiny": (256, 58_982, 2_560),
    "gpt2_124m": (768, 530_841, 7_680),
    "llama_1b": (2048, 3_774_873, 20_480),
    "llama_7b": (4096, 15_099_494, 40_960),
}


@pytest.mark.parametrize("model", list(DERIVED))
def test_a_zero3_run_writes_its_fetch_knobs_derived_from_the_models_width(model):
    h, prefetch, persistence = DERIVED[model]
    shape = compose_config(f"model={model}").model
    zero = _zero_section(f"model={model}", "parallel=zero3")
    assert shape.d_model == h
    assert zero["stage3_prefetch_bucket_size"] == prefetch
    assert zero["stage3_param_persistence_threshold"] == persistence
    assert zero["stage3_max_live_parameters"] == 1_000_000_000  # DeepSpeed's: Hugging Face leaves it too
    # The norms' gains (h elements) stay whole on every rank; every matrix is partitioned.
    assert h <= persistence < h * h
    # The gradient bucket is DeepSpeed's at every stage, capped at the model (not h^2).
    assert zero["reduce_bucket_size"] == min(500_000_000, num_params(shape))
    # ZeRO 1-2 are given no stage-3 key.
    zero2 = _zero_section(f"model={model}", "parallel=zero2")
    assert zero2["reduce_bucket_size"] == zero["reduce_bucket_size"]
    assert not [key for key in zero2 if key.startswith("stage3_")]


def test_a_users_zero3_numbers_win_over_the_derived_ones():
    zero = _zero_section(
        "model=llama_7b",
        "parallel=zero3",
        "parallel.reduce_bucket_size=200000",
        "parallel.prefetch_bucket_size=0",
        "parallel.param_persistence_threshold=100000",
        "parallel.max_live_parameters=300000000",
    )
    assert zero["reduce_bucket_size"] == 200_000
    assert zero["stage3_prefetch_bucket_size"] == 0  # no prefetching
    assert zero["stage3_param_persistence_threshold"] == 100_000  # DeepSpeed's own default
    assert zero["stage3_max_live_parameters"] == 300_000_000


@pytest.mark.parametrize(
    "key",
    ["prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters", "reduce_bucket_size"],
)
def test_a_bad_zero3_number_is_refused_naming_the_key_and_the_fix(key):
    path = f"parallel.{key}"
    # A word is refused on the command line, before Hydra composes anything.
    [problem] = override_problems([f"{path}=lots"])
    assert problem.startswith(f"{path}=lots: must be a whole number"), problem
    # DeepSpeed's docs write 1e9; Hydra reads it as a float, and the refusal writes it out.
    [problem] = override_problems([f"{path}=1e9"])
    assert f"{path}=1e+09: must be a whole number" in problem and f"{path}=1000000000 (" in problem, problem
    # A negative number composes (it is an int) and is refused before any rank starts.
    config = compose_config("parallel=zero3")
    negative = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, **{key: -1}))
    with pytest.raises(ConfigError) as refused:
        validate(negative, launcher=None)
    assert f"{path}=-1: must be " in str(refused.value)
    assert f"e.g. {path}=" in str(refused.value)
