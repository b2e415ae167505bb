"""The optimizer ladder configures steps in place: a step adds nothing to the memory it planned.

The optimizer is built the way DeepSpeed's engine builds it from ladder's config
(``engine._configure_basic_optimizer``), then stepped over a 128 MiB fp32 parameter.
Measured as the rise of the process's high-water RSS over one step after the states exist
(glibc maps allocations this large on their own and unmaps them when freed, so a
temporary shows in the high-water mark and nowhere else). torch's defaults are measured
beside it, so the figure is known to see a temporary: the foreach path (CUDA's default)
allocates the parameters' size, the per-tensor loop (CPU's) up to twice the largest tensor.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from deepspeed.runtime.engine import DeepSpeedEngine

from runner.config import ModelConfig, OptimizerConfig, OptimizerName, ParallelConfig, PrecisionConfig
from runner.engine.deepspeed_config import build_deepspeed_config
from runner.hardware.peak_memory import PeakMemory, host_peak_bytes
from runner.layout import resolve_layout

pytestmark = pytest.mark.unit

NUMEL = 32 * 2**20
PARAM_BYTES = 4 * NUMEL  # 128 MiB


def _ladder_optimizer_params(name: OptimizerName) -> dict[str, Any]:
    config = build_deepspeed_config(
        layout=resolve_layout(gpus=1, tp=1, pp=1, global_size=16, micro_size=4),
        model=ModelConfig(),
        parallel=ParallelConfig(name="zero2", zero_stage=2),
        precision=PrecisionConfig(),
        optimizer=OptimizerConfig(name=name),
        lr=1e-3,
    )
    return dict(config["optimizer"]["params"])


def _deepspeeds_adamw(param: torch.nn.Parameter) -> torch.optim.Optimizer:
    """DeepSpeed 0.19's AdamW branch for a config with ``torch_adam``: its class and kwargs, then the call."""
    params = _ladder_optimizer_params(OptimizerName.adamw)
    params.pop("adam_w_mode")
    # With torch_adam the method returns before it reads anything of the engine.
    optimizer_class, kwargs = DeepSpeedEngine.get_optimizer_configuration(None, params, True)  # type: ignore[arg-type]
    return optimizer_class([param], **params, **kwargs)


def _step_rise(make: Any) -> int:
    """Bytes one step raises the high-water RSS by, once the first step has made the states."""
    param = torch.nn.Parameter(torch.randn(NUMEL))
    param.grad = torch.randn(NUMEL)
    optimizer = make(param)
    optimizer.step()
    PeakMemory(torch.device("cpu")).reset()
    before = host_peak_bytes()
    optimizer.step()
    return host_peak_bytes() - before


def test_ladders_adamw_steps_in_place_where_torchs_defaults_allocate():
    ladder = _step_rise(_deepspeeds_adamw)
    foreach = _step_rise(lambda p: torch.optim.AdamW([p], lr=1e-3, foreach=True))
    loop = _step_rise(lambda p: torch.optim.AdamW([p], lr=1e-3, foreach=False))
    mib = 2**20
    print(
        f"AdamW step over {PARAM_BYTES // mib} MiB of parameters: ladder's +{ladder / mib:.0f} MiB, "
        f"foreach +{foreach / mib:.0f} MiB, per-tensor loop +{loop / mib:.0f} MiB"
    )
    assert foreach >= 0.9 * PARAM_BYTES and loop >= 1.8 * PARAM_BYTES
    assert ladder < 0.05 * PARAM_BYTES


def test_ladders_sgd_steps_in_place():
    params = _ladder_optimizer_params(OptimizerName.sgd)
    assert params["weight_decay"] > 0  # the case whose foreach path copies the gradients
    ladder = _step_rise(lambda p: torch.optim.SGD([p], **params))
    default = _step_rise(lambda p: torch.optim.SGD([p], **{**params, "fused": None}))
    assert default >= 0.9 * PARAM_BYTES
    assert ladder < 0.05 * PARAM_BYTES
