"""Peak FLOP/s: datasheet figures by CUDA device name (dense only), and the CPU calibration."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
import torch

from runner.hardware import cpu_busy
from runner.hardware.calibrate import MAX_REPEATS, timed
from runner.hardware.peak_flops import (
    UnknownDeviceError,
    calibrate_cpu_peak,
    calibrate_cpu_rounds,
    peak_flops_for_cuda_device,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA A100-SXM4-80GB", "bf16", 312),
        ("NVIDIA A100-SXM4-40GB", "fp16", 312),
        ("NVIDIA A100-PCIE-40GB", "bf16", 312),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
        ("NVIDIA H100 80GB HBM3", "bf16", 989),  # dense: never the 1979 sparsity figure
        ("NVIDIA H100 80GB HBM3", "fp32", 67),
        ("NVIDIA H100 PCIe", "bf16", 756),
        ("NVIDIA H200", "bf16", 989),
        ("NVIDIA H200", "fp32", 67),
    ],
)
def test_datasheet_dense_peaks(name: str, precision: str, tflops: float) -> None:
    """torch.cuda.get_device_name() strings map to the dense datasheet figure."""
    assert peak_flops_for_cuda_device(name, precision) == tflops * 1e12


def test_fp32_uses_tf32_figure_only_when_enabled() -> None:
    """fp32 on A100 is 19.5 TFLOP/s; with TF32 matmuls enabled 156."""
    assert peak_flops_for_cuda_device("NVIDIA A100-SXM4-80GB", "fp32") == 19.5e12
    assert peak_flops_for_cuda_device("NVIDIA A100-SXM4-80GB", "fp32", tf32=True) == 156e12


@pytest.mark.parametrize(
    "name",
    ["NVIDIA GeForce RTX 4090", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "Tesla V100"],
)
def test_unknown_device_names_the_device_and_the_override(name: str) -> None:
    """No silent fallback: the error names the device and cluster.peak_tflops."""
    with pytest.raises(UnknownDeviceError) as info:
        peak_flops_for_cuda_device(name, "bf16")
    assert name in str(info.value)
    assert "cluster.peak_tflops" in str(info.value)


def test_unknown_precision_is_rejected() -> None:
    """Only bf16, fp16, fp32 (and tf32) have figures."""
    with pytest.raises(ValueError, match="fp8"):
        peak_flops_for_cuda_device("NVIDIA H100 80GB HBM3", "fp8")


@pytest.mark.parametrize("dtype", [torch.float32, "bf16"])
def test_cpu_calibration_is_a_fast_measurement(dtype: object) -> None:
    """calibrate_cpu_peak returns a positive, finite FLOP/s (its time: bench/plan_speed.py)."""
    flops = calibrate_cpu_peak(dtype, seconds=0.5)
    assert math.isfinite(flops)
    assert flops > 1e6  # any CPU that runs torch does over a MFLOP/s


def test_cpu_calibration_rounds_are_short_and_each_a_figure() -> None:
    """calibrate_cpu_rounds times the fastest layout and size in rounds: one finite figure per round."""
    rounds = calibrate_cpu_rounds(torch.float32, rounds=4, sweep_s=0.2, round_s=0.05)
    assert len(rounds) == 4 and all(math.isfinite(r) and r > 1e6 for r in rounds)


def test_the_cpus_other_processes_held_are_read_from_proc_stat_for_this_processs_cpus(monkeypatch) -> None:
    """Busy ticks (user nice system irq softirq steal; not idle nor iowait) of the CPUs in the
    affinity, less this process's own CPU time, over the wall time."""
    hz = os.sysconf("SC_CLK_TCK")
    stat = (
        "cpu  9 9 9 9 9 9 9 9\ncpu0 {a} 0 0 500 7 0 0 {s}\ncpu1 {a} 0 0 500 0 0 0 0\ncpu7 {a} 0 0 0 0 0 0 0\n"
    )
    assert cpu_busy._busy_seconds({0, 1}, stat.format(a=hz, s=hz)) == 3.0  # cpu7 is not ours
    readings = iter([stat.format(a=0, s=0), stat.format(a=2 * hz, s=hz)])
    monkeypatch.setattr(cpu_busy, "_cpus", lambda: {0, 1})
    monkeypatch.setattr(cpu_busy, "PROC_STAT", SimpleNamespace(read_text=lambda: next(readings)))
    clock = iter([10.0, 12.0])  # 2 s of wall time
    monkeypatch.setattr(cpu_busy.time, "perf_counter", lambda: next(clock))
    cpu = iter([1.0, 2.0])  # this process used 1 CPU second of them
    monkeypatch.setattr(cpu_busy.time, "process_time", lambda: next(cpu))
    others = cpu_busy.OthersUse.start()
    assert others.cores() == pytest.approx((5.0 - 1.0) / 2)


def test_cpu_calibration_rejects_unknown_dtype() -> None:
    """A dtype name it cannot map is an error."""
    with pytest.raises(ValueError, match="int8"):
        calibrate_cpu_peak("int8")


def test_a_short_call_is_timed_further_unless_its_calls_must_match_another_ranks():
    calls: list[int] = []
    cpu = torch.device("cpu")
    timed(lambda: calls.append(1), cpu, repeats=5, warmup=2, shared=False)
    assert len(calls) == 2 + MAX_REPEATS  # microseconds each: timed until MAX_REPEATS
    calls.clear()
    timed(lambda: calls.append(1), cpu, repeats=5, warmup=2, shared=False, extend=False)
    assert len(calls) == 2 + 5  # a collective: exactly its repeats, as on the other rank
