"""Where a step's time goes: seconds per phase (data, forward, backward, optimizer, other).

The training loop marks the end of each phase as it runs; a phase's time is the interval
from the previous mark to its own, summed over the step's micro-batches. So the phases
partition the step: they add up to the step time, ``time/step_s``, up to the clock reads.

On CUDA the marks are CUDA events on the current stream, so the figures are the device's
own timeline (what the kernels of each phase took, with any idle gap between them) and
the loop never waits for the device to read them: the events are read once, at the end
of the step, after the loop has already synchronised on the step's loss. On a CPU they
are ``time.perf_counter`` reads, and the work of a phase is done when it returns.

What runs inside a phase is counted there: ZeRO's gradient reduce-scatters in
``backward``, its parameter all-gathers in ``forward`` and ``backward``, the optimizer's
work and the boundary's checks (the non-finite vote, the gradient norm) in
``optimizer``. Exposed communication (``time/comm_exposed_s``) is the part of those
phases spent blocked in collectives, not a phase of its own.

Under a pipeline (runner/parallel/pipeline.py) the marks are made around each instruction of
DeepSpeed's schedule, and one more phase, ``p2p``, holds the stage-to-stage sends and
receives: the transfers and, mostly, the waits for the neighbouring stage, which is where
the pipeline bubble is spent.
"""

from __future__ import annotations

import time
from typing import Any

import torch

PHASES = ("data", "forward", "backward", "optimizer")
PIPELINE_PHASES = (*PHASES, "p2p")


class PhaseClock:
    """Marks the ends of a step's phases; :meth:`seconds` gives the time of each."""

    def __init__(self, device: torch.device, phases: tuple[str, ...] = PHASES) -> None:
        self._cuda = device.type == "cuda"
        self._phases = phases
        self._marks: list[tuple[str, Any]] = []

    def _now(self) -> Any:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _between(self, earlier: Any, later: Any) -> float:
        if not self._cuda:
            return float(later - earlier)
        return float(earlier.elapsed_time(later)) / 1e3  # ms -> s

    def start(self) -> None:
        """A new step begins: forget the last one's marks."""
        self._marks = [("", self._now())]

    def mark(self, phase: str) -> None:
        """``phase`` ended now: the time since the previous mark is its."""
        self._marks.append((phase, self._now()))

    def seconds(self) -> dict[str, float]:
        """``time/<phase>_s`` for each of the clock's phases, and ``time/other_s`` for the rest."""
        if self._cuda and self._marks:
            self._marks[-1][1].synchronize()
        totals = dict.fromkeys(self._phases, 0.0)
        totals["other"] = 0.0
        for (_, earlier), (phase, later) in zip(self._marks, self._marks[1:], strict=False):
            totals[phase if phase in totals else "other"] += self._between(earlier, later)
        return {f"time/{phase}_s": value for phase, value in totals.items()}
