"""Measured peak memory of this rank: CUDA's allocator peak, or the process's high-water RSS on CPU.

On DeepSpeed's CPU accelerator ``memory_allocated`` is the process RSS sampled at call
time, not a peak (a tensor allocated and freed between calls is missed). The kernel
keeps the real high-water mark (VmHWM, also ``ru_maxrss``); writing ``5`` to
``/proc/self/clear_refs`` resets it, so the CPU figure is "since training began".
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch


class PeakMemory:
    """Reset at the start of training, read at each logged step (bytes)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.label = (
            "CUDA max_memory_allocated"
            if device.type == "cuda"
            else "process high-water RSS since training began"
        )

    def reset(self) -> None:
        """Start counting the peak from now."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        # Not Linux: the peak then counts from process start.
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")

    def read(self) -> int:
        """Peak bytes since the last reset."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return host_peak_bytes()

    def allocator_record(self) -> dict[str, float | int]:
        """CUDA's caching allocator beyond the peak: what it reserved, and the retries and OOMs
        that fragmentation cost (a run near the device's limit shows them first); {} on CPU."""
        if self.device.type != "cuda":
            return {}
        stats = torch.cuda.memory_stats(self.device)
        return {
            "max_reserved_gb": torch.cuda.max_memory_reserved(self.device) / 1e9,
            "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "num_ooms": int(stats.get("num_ooms", 0)),
        }

    def current(self) -> int:
        """Bytes held now: CUDA's allocated bytes, or the process RSS."""
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return host_rss_bytes()


def _proc_status(field: str) -> int | None:
    """A /proc/self/status memory field in bytes (Linux), None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # the kernel reports kB (KiB)
    except OSError:
        pass
    return None


def host_peak_bytes() -> int:
    """The process's high-water RSS since the last reset (or since it started)."""
    peak = _proc_status("VmHWM")
    if peak is not None:
        return peak
    # Deferred: the resource module is POSIX-only.
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def host_rss_bytes() -> int:
    """The process's RSS now (its high-water mark where /proc is missing)."""
    rss = _proc_status("VmRSS")
    return rss if rss is not None else host_peak_bytes()
