"""Numbers agreed over every rank with one all-reduce: a mean, a maximum, the memory peaks."""

from __future__ import annotations

import torch
import torch.distributed as dist

from runner.hardware.peak_memory import host_peak_bytes


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of a one-element tensor over the ranks."""
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return float(value.item()) / dist.get_world_size()


def max_over_ranks(value: float, device: torch.device) -> float:
    """The largest of a number over the ranks."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def peaks_over_ranks(device_peak: int, host_high_water: int, device: torch.device) -> dict[str, float]:
    """The device's peak and the process's host high-water mark (since it started), each the
    most over ranks, in GB; one all-reduce for both. ``host_high_water``: the mark before
    training, which a CPU device's peak reset clears from the kernel's
    (runner/hardware/peak_memory.py)."""
    host = max(host_high_water, host_peak_bytes())
    tensor = torch.tensor([float(device_peak), float(host)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return {"memory/peak_gb": float(tensor[0]) / 1e9, "memory/host_peak_gb": float(tensor[1]) / 1e9}
