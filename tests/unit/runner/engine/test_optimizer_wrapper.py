"""The wrapper runner/engine/optimizer_wrapper.py names for a layout is the one DeepSpeed 0.19.8 chooses
for the config ladder writes, asked of DeepSpeed's own choice with no engine built."""

from __future__ import annotations

import itertools
from types import MethodType, SimpleNamespace

import pytest
import torch

from runner.config import (
    ModelConfig,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    Precision,
    PrecisionConfig,
)
from runner.engine.deepspeed_config import build_deepspeed_config
from runner.engine.optimizer_wrapper import OptimizerWrapper, optimizer_wrapper
from runner.layout import resolve_layout

pytestmark = pytest.mark.unit

# The engine's methods _do_optimizer_sanity_check reads the config through.
_ENGINE_METHODS = (
    "get_data_types",
    "fp16_enabled",
    "bfloat16_enabled",
    "zero_optimization",
    "zero_optimization_stage",
    "zero_cpu_offload",
    "zero_allow_untested_optimizer",
    "zero_compute_grad_norm",
)


def _deepspeed_choice(
    ds_config: dict, *, pp: int, basic_optimizer: torch.optim.Optimizer, monkeypatch: pytest.MonkeyPatch
) -> OptimizerWrapper:
    """The wrapper DeepSpeed's engine.py ``_configure_optimizer`` builds for ``ds_config``: its
    ``_do_optimizer_sanity_check`` on an object holding the config, then its dispatch."""
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.runtime import engine as engine_module
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.constants import BFLOAT16, DDP_BFLOAT16, FP16
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.config import ZERO_OPTIMIZATION, ZeroStageEnum

    # ZeRO's list of tested optimizers only decides a warning (SGD is allowed untested), and
    # asking it needs a process group and imports Muon, which compiles its kernels.
    monkeypatch.setattr(engine_module, "is_zero_supported_optimizer", lambda optimizer: True)

    engine = SimpleNamespace(_config=DeepSpeedConfig(ds_config), pipeline_parallelism=pp > 1, global_rank=0)
    for name in _ENGINE_METHODS:
        setattr(engine, name, MethodType(getattr(DeepSpeedEngine, name), engine))
    choice = DeepSpeedEngine._do_optimizer_sanity_check(engine, basic_optimizer)
    if choice == ZERO_OPTIMIZATION:
        # engine.py _configure_zero_optimizer: stage_1_and_2.py up to the gradients' stage, else stage3.py
        stages_1_and_2 = engine.zero_optimization_stage() <= ZeroStageEnum.gradients
        return OptimizerWrapper.zero_optimizer if stages_1_and_2 else OptimizerWrapper.zero3_optimizer
    if choice in (FP16, DDP_BFLOAT16):
        fused = isinstance(basic_optimizer, FusedAdam)
        return OptimizerWrapper.fp16_optimizer if fused else OptimizerWrapper.fp16_unfused_optimizer
    if choice == BFLOAT16:
        return OptimizerWrapper.bf16_optimizer
    assert choice is None, choice
    return OptimizerWrapper.none


@pytest.mark.parametrize(
    ("zero_stage", "precision", "pp", "optimizer"),
    list(itertools.product(range(4), list(Precision), [1, 2], list(OptimizerName))),
)
def test_the_wrapper_named_is_the_one_deepspeed_builds(zero_stage, precision, pp, optimizer, monkeypatch):
    # One data-parallel rank: DeepSpeed's config checks the batch against this process's world of 1.
    layout = resolve_layout(gpus=pp, tp=1, pp=pp, global_size=8, micro_size=4)
    ds_config = build_deepspeed_config(
        layout=layout,
        model=ModelConfig(),
        parallel=ParallelConfig(name=f"zero{zero_stage}", zero_stage=zero_stage, pp=pp),
        precision=PrecisionConfig(name=precision),
        optimizer=OptimizerConfig(name=optimizer),
        lr=1e-3,
    )
    # What DeepSpeed builds from the optimizer section: torch's AdamW (torch_adam) or SGD.
    params = [torch.nn.Parameter(torch.zeros(2))]
    adamw = optimizer == OptimizerName.adamw
    basic = torch.optim.AdamW(params) if adamw else torch.optim.SGD(params, lr=1e-3)
    expected = _deepspeed_choice(ds_config, pp=pp, basic_optimizer=basic, monkeypatch=monkeypatch)
    assert optimizer_wrapper(precision=precision, zero_stage=zero_stage, pp=pp) is expected


def test_bf16_at_stage_0_under_a_pipeline_is_bf16_optimizer():
    """The case the memory model and the checkpoint code turn on, named outright."""
    assert optimizer_wrapper(precision="bf16", zero_stage=0, pp=2) is OptimizerWrapper.bf16_optimizer
    assert optimizer_wrapper(precision="bf16", zero_stage=0, pp=1) is OptimizerWrapper.fp16_unfused_optimizer
    assert optimizer_wrapper(precision="fp16", zero_stage=0, pp=2) is OptimizerWrapper.fp16_unfused_optimizer
