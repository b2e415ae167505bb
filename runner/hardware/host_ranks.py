"""How many ranks the local launcher places on this host: one per CUDA device, else one per CPU core.

The refusal of more ranks than this host holds (runner/preflight/validate.py) and a plan's gpus
per node on a cluster that does not give them (runner/step_time/device_figures.py) count alike.
"""

from __future__ import annotations

import os

from runner.hardware.cuda_devices import cuda_device_count


def host_ranks() -> tuple[int, bool]:
    """The ranks this host holds, and whether they are CUDA devices (else CPU cores, one rank each)."""
    count = cuda_device_count()
    if count:
        return count, True
    return os.cpu_count() or 1, False


__all__ = ["host_ranks"]
