"""The CUDA paths CI cannot reach: nccl, CUDA memory statistics, the peak from the device name, bf16.

Opt-in: skipped where no CUDA device is visible. bench/gpu_check.sh runs them on a GPU machine.
"""

from __future__ import annotations

import json

import pytest
import torch

from runner.diagnose.out_of_memory import is_out_of_memory
from runner.hardware.peak_flops import peak_flops_for_cuda_device

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_the_peak_comes_from_the_device_name():
    name = torch.cuda.get_device_name()
    peak = peak_flops_for_cuda_device(name, "bf16")
    assert 1e14 < peak < 2e15, (name, peak)  # dense bf16: 312 (A100) .. 989 (H100/H200) TFLOP/s


def test_a_cuda_allocation_beyond_the_device_is_told_as_out_of_memory():
    total = torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(RuntimeError) as refused:
        torch.empty(total + 2**30, dtype=torch.uint8, device="cuda")
    assert is_out_of_memory(refused.value), refused.value


def test_one_gpu_bf16_run_uses_nccl_and_cuda_memory(train):
    result = train(
        "precision=bf16",
        "train.steps=5",
        "batch.micro_size=4",
        "logger=none",
        "data=synthetic",
        "train.profile_step=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["accelerator"] == "cuda"
    assert summary["peak_memory_measure"] == "CUDA max_memory_allocated"
    allocator = summary["cuda_allocator"]  # reserved >= allocated; a tiny run needs no retry
    assert allocator["max_reserved_gb"] >= summary["final"]["memory/peak_gb"] - 1e-3
    assert allocator["num_ooms"] == 0
    assert "datasheet" in summary["peak_flops_source"]
    assert 0 < summary["final"]["throughput/mfu"] < 1
    # Without tensor parallelism the whole model is built on the GPU, in bf16 (runner/engine/build.py).
    build = summary["model_build"]
    assert build["method"] == "whole" and build["device_peak_gb"] >= 2 * build["num_params"] / 1e9
    # The phases, read from CUDA events on the device's timeline, add up to the host's step time.
    final = summary["final"]
    phases = sum(final[f"time/{phase}_s"] for phase in ("data", "forward", "backward", "optimizer", "other"))
    assert phases == pytest.approx(final["time/step_s"], rel=0.1), final
    assert final["time/backward_s"] > final["time/data_s"]
    for term, tolerance in {"params": 0.02, "grads": 0.02, "optimizer": 0.02, "activations": 0.15}.items():
        assert abs(summary["memory"]["rel_error"][term]) <= tolerance, (term, summary["memory"])
    # train.profile_step: the trace holds the step's CUDA kernels, the table sorts by device time.
    events = json.loads((result.run_dir / "profile" / "rank0_step2.json").read_text())["traceEvents"]
    assert any(event.get("cat") == "kernel" for event in events)
    assert "Self CUDA" in (result.run_dir / "profile" / "rank0_step2_ops.txt").read_text()
    # Exposed communication, NaN per step on CUDA, is read from the profiled step's kernels.
    profile = summary["profile"]
    assert 0 <= profile["comm_exposed_s"] <= profile["comm_kernels_s"], profile


def test_ddp_in_fp16_trains_the_experiment_zero1_trains(train):
    """Stage 0's 16-bit optimizer wrapper (DeepSpeed's FP16_UnfusedOptimizer, bf16 and fp16) steps
    once when built (runner/engine/fixes/stage0_step_at_construction.py), and in fp16 DeepSpeed neither
    scales the loss
    before backward nor lets it clip (runner/engine/fixes/fp16_stage0_loss_scale.py); ladder mends both. On a
    CPU:
    tests/multirank/test_fp16_layouts.py; this is the proof on CUDA's fp16 kernels."""
    common = ("precision=fp16", "train.steps=4", "batch.micro_size=4", "logger=none")
    common = (*common, "data=synthetic")
    losses = {}
    for parallel in ("ddp", "zero1"):
        result = train(f"parallel={parallel}", *common)
        assert result.returncode == 0, result.stderr[-3000:]
        losses[parallel] = [m["loss"] for m in result.metrics]
    # Measured on a CPU in bf16: 2.9e-5 apart over two steps; 0.087 after one step without the undo.
    assert losses["ddp"] == pytest.approx(losses["zero1"], abs=5e-3), losses
