"""DeepSpeed's accelerator is named before DeepSpeed is imported, and a host without a GPU driver
names it without importing torch (runner/hardware/cuda_devices.py ``select_accelerator``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from train_helpers import ROOT

from runner.hardware import cuda_devices

pytestmark = pytest.mark.unit


def test_without_a_gpu_driver_the_cpu_accelerator_is_named_and_torch_is_not_imported(monkeypatch):
    monkeypatch.setattr(cuda_devices, "gpu_driver_present", lambda: False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert cuda_devices.select_accelerator() == "cpu"
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    if cuda_devices.gpu_driver_present():
        return  # this host's own answer below asks torch
    code = (
        "import os, sys\n"
        "from runner.hardware.cuda_devices import select_accelerator\n"
        "print(select_accelerator(), os.environ['DS_ACCELERATOR'], 'torch' in sys.modules)"
    )
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["cpu", "cpu", "False"], done.stderr[-2000:]


def test_with_a_gpu_driver_torch_answers(monkeypatch):
    monkeypatch.setattr(cuda_devices, "gpu_driver_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert cuda_devices.select_accelerator() == "cuda"
    assert "DS_ACCELERATOR" not in os.environ  # DeepSpeed detects CUDA itself
