"""On a host that sees CUDA, what would fail every rank after its build is refused before launch."""

from __future__ import annotations

import pytest
import torch
from train_helpers import compose_config

from runner.errors import ConfigError
from runner.preflight import validate as validate_module
from runner.preflight.validate import cuda_launch_problems, validate

pytestmark = pytest.mark.unit


@pytest.fixture
def sees(monkeypatch):
    """This host as one that sees a CUDA device named ``name``."""

    def _sees(name: str) -> None:
        monkeypatch.setattr(validate_module, "cuda_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: name)

    return _sees


def test_a_device_without_a_known_peak_is_refused_with_the_key_that_gives_it(sees):
    sees("NVIDIA H200 NVL")
    [problem] = cuda_launch_problems(compose_config("precision=bf16"), environ={})
    assert "no dense peak FLOP/s is known for CUDA device 'NVIDIA H200 NVL' (bf16)" in problem
    assert "cluster.peak_tflops=<dense TFLOP/s per device at bf16>" in problem
    # A cluster group's figure, or the override, is the peak then: nothing to refuse.
    assert cuda_launch_problems(compose_config("precision=bf16", "cluster=h200"), environ={}) == []
    assert cuda_launch_problems(compose_config("cluster.peak_tflops=835"), environ={}) == []


def test_ds_accelerator_cpu_beside_a_visible_device_is_refused_before_launch(sees):
    sees("NVIDIA H200")
    config = compose_config("precision=bf16")
    assert cuda_launch_problems(config, environ={}) == []
    assert cuda_launch_problems(config, environ={"DS_ACCELERATOR": "cuda"}) == []
    [problem] = cuda_launch_problems(config, environ={"DS_ACCELERATOR": "cpu"})
    assert problem.startswith("DS_ACCELERATOR=cpu but a CUDA device is visible")
    assert "unset DS_ACCELERATOR" in problem


def test_the_launch_check_runs_with_the_others_and_a_plan_skips_it(sees, monkeypatch):
    sees("NVIDIA H200 NVL")
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(validate_module, "host_ranks_available", lambda: (8, "8 CUDA devices"))
    config = compose_config("precision=bf16")
    with pytest.raises(ConfigError, match="NVIDIA H200 NVL"):
        validate(config, launcher="local")
    validate(config, launcher=None)  # plan=true: an unknown peak is a line of the plan, not an error
