"""Whether this host has CUDA devices, asking torch only where a GPU driver is there to answer.

The launching process checks devices before any rank starts. Importing torch costs about
two seconds; on a host without NVIDIA's driver (``/dev/nvidiactl``, ``/proc/driver/nvidia``)
or ROCm's (``/dev/kfd``, which torch also reports as CUDA) no device can be visible, so the
answer is known without it. Ranks import torch anyway and ask it directly.
"""

from __future__ import annotations

import os
from pathlib import Path

GPU_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")


def gpu_driver_present() -> bool:
    """Whether a GPU driver's device node or proc entry exists on this host."""
    return any(Path(path).exists() for path in GPU_DRIVER_PATHS)


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, without importing torch on a host with no GPU driver."""
    if not gpu_driver_present():
        return False
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch

    return bool(torch.cuda.is_available())


def select_accelerator() -> str:
    """``cuda`` when a CUDA device is visible, else ``cpu`` (DeepSpeed's CPU accelerator, gloo),
    named for DeepSpeed in DS_ACCELERATOR: a host without a GPU driver decides without torch."""
    if cuda_available():
        return "cuda"
    # Must be set before deepspeed is imported: its accelerator is chosen at import.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return "cpu"


def cuda_device_count() -> int:
    """How many CUDA devices this process sees (0 without a GPU driver)."""
    if not cuda_available():
        return 0
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch

    return int(torch.cuda.device_count())
