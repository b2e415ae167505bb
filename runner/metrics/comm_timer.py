"""Exposed communication: the seconds the training thread spends blocked in collectives.

Definition (docs/benchmarks.md, "Exposed communication"): communication is exposed
when the training thread cannot go on computing until it ends. Every collective
DeepSpeed issues (ZeRO's reduce-scatters and all-gathers, stage 0's all-reduce) goes
through one backend object, ``deepspeed.comm.comm.cdb``; wrapping its collective
methods times

- a blocking call from entry to return, and
- an asynchronous call's launch plus the ``wait()`` on its handle, which is where the
  thread blocks if the transfer has not finished behind the compute that followed.

So communication that overlaps compute (``parallel.overlap_comm``) counts only for
the part the compute did not hide. The figure also holds time spent waiting for a
slower rank to reach the same collective (load imbalance shows up here).

This is exact for gloo on CPU, where a collective runs on the calling thread or on
gloo's own threads and the caller blocks on it. NCCL on CUDA returns once the kernel
is queued, so host-side time is not device-side exposure: there the runner reports
NaN and says so, and the profiled step's trace measures it (runner/metrics/trace_overlap.py).

Point-to-point sends and receives (pipeline stages) are not counted: a blocked
receive mostly waits for the other stage's compute, which is the pipeline bubble.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_base",
    "all_gather_coalesced",
    "all_to_all_single",
    "all_to_all",
)

UNMEASURED_ON_CUDA = (
    "NCCL collectives return to the host once queued, so host-blocked time is not the "
    "exposed time on CUDA; train.profile_step=N measures it there from step N's kernels "
    "(summary.json profile.comm_exposed_s)"
)


class _TimedWork:
    """An async collective's handle whose ``wait()`` adds its blocked time to the timer."""

    def __init__(self, work: Any, timer: CollectiveTimer) -> None:
        self._work = work
        self._timer = timer

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._timer.seconds += time.perf_counter() - started

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class CollectiveTimer:
    """Sums the training thread's blocked seconds in the wrapped backend's collectives."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._restore: list[tuple[Any, str]] = []

    def _timed(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                result = call(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1
            return _TimedWork(result, self) if hasattr(result, "wait") else result

        # A compiled block (train.compile=true) that calls a collective, as AutoTP's layers
        # do, runs this wrapper eagerly: a clean graph break where the clock is read.
        return torch.compiler.disable(timed)

    def install(self, backend: Any) -> CollectiveTimer:
        """Wrap ``backend``'s collective methods (DeepSpeed's ``cdb``); returns self."""
        for name in COLLECTIVES:
            if callable(getattr(backend, name, None)):
                setattr(backend, name, self._timed(getattr(backend, name)))
                self._restore.append((backend, name))
        return self

    def take(self) -> float:
        """Seconds blocked since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def remove(self) -> None:
        """Give the backend its own methods back."""
        for backend, name in self._restore:
            delattr(backend, name)  # the instance attribute hid the class's method
        self._restore.clear()


def deepspeed_backend() -> Any:
    """DeepSpeed's communication backend object (set by ``deepspeed.init_distributed``)."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.comm import comm

    return comm.cdb
