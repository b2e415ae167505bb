"""``train.profile_step=N``: a ``torch.profiler`` trace of optimizer step N on every rank.

The phase clock (runner/metrics/phase_clock.py) says how a step's time splits into forward,
backward and the rest; a trace shows every operator and kernel inside those phases, the
collectives included, on each rank's own timeline. Each rank writes, under the run
directory's ``profile/``:

- ``rank<r>_step<N>.json``: a Chrome trace (open it in https://ui.perfetto.dev or
  chrome://tracing). On CUDA it also holds the kernels on the device's streams, which is
  where communication that overlaps compute can be seen: the step's collective kernel
  time and the part of it no compute kernel hid (runner/metrics/trace_overlap.py) go into
  summary.json's ``profile`` (the per-step exposed-communication metric is measured on
  CPU only, see runner/metrics/comm_timer.py).
- ``rank<r>_step<N>_ops.txt``: torch's table of the operators that took the most time
  in that step, by self time (device time on CUDA), as ``key_averages().table`` prints it.

The profiled step is slower than the others (the profiler records every operator); the
report's medians over many steps barely move, but its own ``time/step_s`` is not the
run's speed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from runner.metrics.trace_overlap import device_comm
from runner.rundir.run_files import PROFILE_DIR

OPS_SHOWN = 30  # rows of the operator table


class StepProfiler:
    """Starts torch's profiler when step ``step`` begins and writes its trace when it ends."""

    def __init__(self, step: int, *, run_dir: Path, rank: int, device: torch.device) -> None:
        self.step = step  # -1: profile nothing
        self._dir = run_dir / PROFILE_DIR
        self._rank = rank
        self._cuda = device.type == "cuda"
        self._profile: Any = None
        self.written: list[Path] = []
        self.comm_on_device: dict[str, float] | None = None  # CUDA: from the trace's kernels

    def step_started(self, step: int) -> None:
        if step != self.step:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self._profile = profile(activities=activities, record_shapes=True)
        self._profile.start()

    def step_done(self, step: int) -> None:
        """Stop the profiler after the profiled step and write its trace and operator table."""
        if self._profile is None or step != self.step:
            return
        if self._cuda:
            torch.cuda.synchronize()  # the step's kernels belong in its trace
        self._profile.stop()
        self._dir.mkdir(parents=True, exist_ok=True)
        stem = f"rank{self._rank}_step{step}"
        trace = self._dir / f"{stem}.json"
        self._profile.export_chrome_trace(str(trace))
        sort_by = "self_device_time_total" if self._cuda else "self_cpu_time_total"
        table = self._profile.key_averages().table(sort_by=sort_by, row_limit=OPS_SHOWN)
        ops = self._dir / f"{stem}_ops.txt"
        ops.write_text(table + "\n")
        self.written = [trace, ops]
        self._profile = None
        if self._cuda:
            self.comm_on_device = device_comm(trace)

    def summary(self, run_dir: Path) -> dict[str, Any] | None:
        """summary.json's ``profile``: the step, and this rank's files relative to the run directory."""
        if not self.written:
            return None
        return {
            "step": self.step,
            "files": [str(path.relative_to(run_dir)) for path in self.written],
            "every_rank": f"{PROFILE_DIR}/rank<r>_step{self.step}.json and _ops.txt",
            **(self.comm_on_device or {}),
        }
