"""Peak FLOP/s per device: dense datasheet figures for known CUDA devices, a measurement on CPU.

MFU divides by these (PaLM, arXiv 2204.02311, appendix B). Datasheets print tensor-core
figures "with sparsity" (2:4 structured sparsity doubles them); a dense training run can
never reach those, so the table holds the dense figures only: the sparsity figure / 2.
Units: FLOP/s (the table is written in TFLOP/s = 1e12 FLOP/s).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.config_choices import Precision

# Dense peaks in TFLOP/s per device and precision ("tf32": fp32 matmuls on tensor cores).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet (same compute for 40/80 GB, SXM4 and PCIe):
    # BF16/FP16 tensor core 312 (624 with sparsity), TF32 156 (312), FP32 19.5.
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16/FP16 1979 with sparsity -> 989
    # dense, TF32 989 with sparsity -> 494.5, FP32 67.
    "H100 SXM": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},
    # Same datasheet, H100 PCIe: BF16/FP16 1513 with sparsity -> 756, TF32 756 -> 378, FP32 51.
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: the H100 SXM's compute, more memory.
    "H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},
}

# torch.cuda.get_device_name() -> table key. First match wins; NVL variants (H100 NVL,
# H200 NVL) have other clocks and peaks and are deliberately left unmatched.
_DEVICE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bNVL\b", re.IGNORECASE), ""),  # no entry: unknown
    (re.compile(r"\bA100\b", re.IGNORECASE), "A100"),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    (re.compile(r"\bH100\b.*\bPCIe\b", re.IGNORECASE), "H100 PCIe"),  # "NVIDIA H100 PCIe"
    (re.compile(r"\bH100\b.*\b(HBM3|SXM\d?)\b", re.IGNORECASE), "H100 SXM"),  # "NVIDIA H100 80GB HBM3"
    (re.compile(r"\bH200\b", re.IGNORECASE), "H200"),  # "NVIDIA H200"
)

_PRECISIONS = ("bf16", "fp16", "fp32", "tf32")


class UnknownDeviceError(ValueError):
    """No dense peak is known for this device: the user must give one (cluster.peak_tflops)."""

    def __init__(self, message: str, *, device_name: str) -> None:
        super().__init__(message)
        self.device_name = device_name  # as torch.cuda.get_device_name() names it


def device_key(device_name: str) -> str | None:
    """The PEAK_TFLOPS key for a CUDA device name, or None when the device is not in the table."""
    for pattern, key in _DEVICE_PATTERNS:
        if pattern.search(device_name):
            return key or None
    return None


def peak_flops_for_cuda_device(device_name: str, precision: str, *, tf32: bool = False) -> float:
    """Dense peak FLOP/s of one device named as torch.cuda.get_device_name() names it, at `precision`.

    ``precision`` is "bf16", "fp16" or "fp32" (or "tf32"). fp32 gives the plain fp32
    figure unless ``tf32=True`` (matmuls allowed on tensor cores in TF32, e.g.
    ``torch.backends.cuda.matmul.allow_tf32``), which gives the TF32 figure. An unknown
    device raises UnknownDeviceError: never a silent fallback to another device's peak.
    """
    prec = str(getattr(precision, "value", precision))
    if prec not in _PRECISIONS:
        raise ValueError(f"precision={prec!r} is not one of {', '.join(_PRECISIONS)}")
    if prec == "fp32" and tf32:
        prec = "tf32"
    key = device_key(device_name)
    if key is None:
        raise UnknownDeviceError(
            f"no dense peak FLOP/s is known for CUDA device {device_name!r} ({prec}); known: "
            f"{', '.join(PEAK_TFLOPS)}. Set cluster.peak_tflops=<dense TFLOP/s per device at "
            f"{prec}> to give it (from the device's datasheet, without the sparsity factor)",
            device_name=device_name,
        )
    return PEAK_TFLOPS[key][prec] * 1e12


def torch_dtype(dtype: Any) -> Any:
    """`dtype` as a torch.dtype: a torch.dtype, a Precision or its name (fp32, bf16, fp16)."""
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(getattr(dtype, "value", dtype))
    if name not in Precision.__members__:
        raise ValueError(f"dtype={name!r} is not a torch.dtype nor one of {', '.join(Precision.__members__)}")
    return Precision(name).torch_dtype


@dataclass(frozen=True)
class _Fastest:
    """The matmul layout and size that did the most FLOP/s in a size sweep."""

    flops: float
    layout: str
    n: int


def _fastest_matmul(dtype: Any, seconds: float) -> _Fastest:
    """The size sweep of :func:`calibrate_cpu_peak`, in ``seconds``: the fastest layout and size."""
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch

    from runner.hardware.cpu_half_matmul import half_matmuls_in_fp32

    compute_dtype = torch_dtype(dtype)
    if seconds <= 0:
        raise ValueError(f"seconds={seconds} must be > 0")
    deadline = time.perf_counter() + seconds
    layouts = dict(_LAYOUTS)
    best = _Fastest(0.0, "linear", 128)
    n = 128
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad(), half_matmuls_in_fp32(compute_dtype):
        while layouts:
            a, b = _operands(n, compute_dtype, generator)
            for name in list(layouts):
                matmul = _matmul(name)
                matmul(a, b)  # warm-up: first-call dispatch and thread-pool start
                size_deadline = min(deadline, time.perf_counter() + seconds / (4 * len(layouts)))
                fastest = _fastest_call(matmul, a, b, until=size_deadline)
                if 2.0 * n**3 / fastest > best.flops:  # n^3 multiply-adds, 2 FLOPs each
                    best = _Fastest(2.0 * n**3 / fastest, name, n)
                # Next size: warm-up + at least two timed runs, each ~8x this one.
                if n >= 1024 or time.perf_counter() + 3 * 8 * fastest > deadline:
                    del layouts[name]
            n *= 2
    return best


# The two operand layouts a transformer's matmuls run (see calibrate_cpu_peak).
_LAYOUTS = {"linear": "x @ W.T, every nn.Linear's forward", "mm": "x @ W, the input gradient in backward"}


def _matmul(name: str) -> Callable[[Any, Any], Any]:
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch
    import torch.nn.functional as F

    return F.linear if name == "linear" else torch.mm


def _operands(n: int, dtype: Any, generator: Any) -> tuple[Any, Any]:
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch

    return (
        torch.randn(n, n, generator=generator).to(dtype),
        torch.randn(n, n, generator=generator).to(dtype),
    )


def _fastest_call(matmul: Callable[[Any, Any], Any], a: Any, b: Any, *, until: float) -> float:
    """The shortest of repeated calls until ``until`` (at least one), in seconds."""
    fastest = float("inf")
    while True:
        t0 = time.perf_counter()
        matmul(a, b)
        fastest = min(fastest, time.perf_counter() - t0)
        if time.perf_counter() >= until:
            return fastest


def calibrate_cpu_peak(dtype: Any, *, seconds: float = 0.5) -> float:
    """Measured FLOP/s of square matmuls in `dtype` on this process's CPU threads: the best seen.

    A measurement, not a datasheet figure: report it as such. Two operand layouts are timed,
    the two a transformer's matmuls run: ``F.linear`` (x @ W.T, every nn.Linear's forward)
    and ``torch.mm`` (x @ W, the input gradient in backward). Where a CPU has no native bf16
    they run at very different speeds (measured on a 2-core AVX2 host, n = 512: 15.5 GFLOP/s
    for linear, 1.5 for mm), and a peak from the slow one alone put training above 100% MFU.
    Sizes grow 128, 256, ... up to 1024 while a layout's next size still fits the time
    budget, each timed repeatedly; the best 2n^3 / t over all is returned (the best, not the
    mean, because other processes share the cores). A matmul of the next size is assumed to
    cost 8x (n^3); a layout stops growing before it could overrun, so the whole call takes
    about `seconds` even where a layout has no fast kernel. Where the CPU has no 16-bit GEMM
    kernels, 16-bit matmuls are timed in fp32 as a rank computes them (runner/hardware/cpu_half_matmul.py).
    """
    return _fastest_matmul(dtype, seconds).flops


# A calibration's rounds: several short ones, spread over about a second, so that a burst of
# another process's work falls in a few of them, not in all (runner/hardware/mfu_peak.py keeps a
# high percentile of them).
CALIBRATION_ROUNDS = 9
ROUND_S = 0.08  # each round's timed calls
BETWEEN_ROUNDS_S = 0.03  # a pause between rounds, to spread them over time


def calibrate_cpu_rounds(
    dtype: Any, *, rounds: int = CALIBRATION_ROUNDS, sweep_s: float = 0.4, round_s: float = ROUND_S
) -> list[float]:
    """FLOP/s of ``rounds`` short rounds, each the best of repeated calls of the matmul layout and
    size that :func:`calibrate_cpu_peak`'s size sweep (``sweep_s``) found fastest; in round order.

    About ``sweep_s + rounds * (round_s + BETWEEN_ROUNDS_S)`` seconds (1.4 s by default).
    """
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch

    from runner.hardware.cpu_half_matmul import half_matmuls_in_fp32

    fastest = _fastest_matmul(dtype, sweep_s)
    compute_dtype = torch_dtype(dtype)
    matmul, n = _matmul(fastest.layout), fastest.n
    measured = []
    with torch.no_grad(), half_matmuls_in_fp32(compute_dtype):
        a, b = _operands(n, compute_dtype, torch.Generator().manual_seed(0))
        matmul(a, b)  # warm-up
        for _ in range(rounds):
            seconds = _fastest_call(matmul, a, b, until=time.perf_counter() + round_s)
            measured.append(2.0 * n**3 / seconds)
            time.sleep(BETWEEN_ROUNDS_S)
    return measured


__all__ = [
    "PEAK_TFLOPS",
    "UnknownDeviceError",
    "calibrate_cpu_peak",
    "calibrate_cpu_rounds",
    "device_key",
    "peak_flops_for_cuda_device",
]
