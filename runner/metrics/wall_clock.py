"""Where one attempt's wall time went, on rank 0: from its command's start to its summary.

The per-step phases (runner/metrics/phase_clock.py) say where a step's time goes; this says where
the run's goes, the accounting behind "goodput" (the share of wall time spent training),
in parts a user can act on:

    prelaunch    the launching process before it started the ranks (``python train.py`` on this
                 host): composing, checking and planning the run, a checkpoint's conversion
    calibration  of the launching process's time, the step-time model measuring this host's
                 device (runner/step_time/device_figures.py; cached, so mostly a device's first run)
    launch       the interpreter, torch and DeepSpeed's imports, the process group; under
                 torchrun or srun also the conversion of a checkpoint moved onto this
                 layout (rank 0 converts; layout_history and goodput name its seconds)
    build        the model, on the layout (runner/engine/build.py), and its compilation set-up
    engine       deepspeed.initialize and ladder's hooks on it
    resume       loading the checkpoint a resumed run continues from
    setup        the rest before the first step: peak FLOP/s, data, metric sinks, estimates
    steps        every optimizer step, the first one's one-time costs included (first_step_s)
    checkpoints  each save, with the wait for every rank's files (count, bytes, GB/s)
    eval         the held-out evaluations (train.eval_every)
    other        between the steps: metric reductions and logging, the stop check

The parts add up to ``total_s``. Marks are ``time.time()``; a process's start is the
kernel's (``process_start``), so the total includes the imports before any ladder code ran. Under
torchrun or srun the rank is the command: its planning and calibration fall in its own launch,
calibration named apart.
``process_group_s``, a part of launch, is the time rank 0 took to join the process group:
mostly the wait for the last rank to arrive, so a launch long on it points at another rank's
start (its imports, a slow node), one long without it at this rank's own.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

STEP_TIMES_KEPT = 100_000  # the latest steps' seconds kept for their spread (about 3 MB)
SETUP_PHASES = ("prelaunch", "calibration", "launch", "build", "engine", "resume", "setup")
SHOWN_IF_SPENT = ("prelaunch", "calibration", "resume")  # in the run's line only where they took time


def process_start() -> float:
    """When this process started, in seconds since the epoch.

    psutil adds the process's start in clock ticks since boot to the boot time, which Linux's
    /proc/stat gives in whole seconds: its figure is early by up to a second (0.6 s seen), all
    of which a run's ``launch`` would count. Now less the time since the start (/proc/uptime,
    to 10 ms) has no such error; it is used where it agrees with psutil's to within that second
    (a container whose /proc/uptime is its own, not the kernel's, would not).
    """
    coarse = float(psutil.Process(os.getpid()).create_time())
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        # Field 22 of /proc/<pid>/stat, after the command's closing parenthesis: clock ticks since boot.
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        fine = time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return coarse
    return fine if coarse - 0.05 <= fine <= coarse + 1.05 else coarse


@dataclass(frozen=True)
class BeforeRanks:
    """The launching process's part of the wait: when the command started (its process's start)
    and the seconds of it the step-time model's calibration took."""

    started: float
    calibration_s: float = 0.0


class WallClock:
    """The attempt's parts: ``mark`` ends a setup phase; steps and saves are added as they end.

    ``before``: the launching process's start and calibration, where it started this rank (the
    total then runs from the command's start); None: from this process's start.
    """

    def __init__(
        self,
        started: float | None = None,
        *,
        process_group_s: float = 0.0,
        before: BeforeRanks | None = None,
    ) -> None:
        own = process_start() if started is None else started
        self.process_group_s = process_group_s  # of launch: joining the process group
        self.setup: dict[str, float] = dict.fromkeys(SETUP_PHASES, 0.0)
        self.started = own if before is None else min(own, before.started)
        self._last = own
        if before is not None:
            self.setup["calibration"] = before.calibration_s
            # A rank the launching process started: the wait before it is the launcher's. A rank
            # that is itself the command (torchrun) calibrated in its own launch: left out of it.
            self.setup["prelaunch"] = max(0.0, own - before.started - before.calibration_s)
            self._last = max(own, before.started + before.calibration_s)
        self.steps_s = 0.0
        self.steps = 0
        self.first_step_s: float | None = None
        # Each step's seconds, the latest STEP_TIMES_KEPT: how much they vary (runner/metrics/step_spread.py).
        self.step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self.checkpoint_s = 0.0
        self.checkpoint_bytes = 0
        self.checkpoints = 0
        self._last_save = (0.0, 0)
        self.eval_s = 0.0
        self.evaluations = 0

    def mark(self, phase: str) -> None:
        """The time since the previous mark (or the process's start) was ``phase``."""
        now = time.time()
        self.setup[phase] += now - self._last
        self._last = now

    def step(self, seconds: float) -> None:
        """One optimizer step took ``seconds`` (its time/step_s)."""
        if self.first_step_s is None:
            self.first_step_s = seconds
        self.steps_s += seconds
        self.steps += 1
        self.step_times.append(seconds)

    def checkpoint(self, seconds: float, nbytes: int) -> None:
        """One save took ``seconds`` on this rank and left ``nbytes`` on disk."""
        self.checkpoint_s += seconds
        self.checkpoint_bytes += nbytes
        self.checkpoints += 1
        self._last_save = (seconds, nbytes)

    def evaluation(self, seconds: float) -> None:
        """One held-out evaluation took ``seconds``."""
        self.eval_s += seconds
        self.evaluations += 1

    @property
    def last_save_s(self) -> float:
        """Seconds the latest save took."""
        return self._last_save[0]

    def last_save(self, tag: str) -> str:
        """The log line of the latest save, e.g. ``checkpoint step_00000004: 0.05 GB in 0.21 s``."""
        seconds, nbytes = self._last_save
        rate = f" ({nbytes / seconds / 1e9:.2f} GB/s)" if seconds > 0 else ""
        return f"checkpoint {tag}: {nbytes / 1e9:.3f} GB in {seconds:.2f} s{rate}"

    def summary(self) -> dict[str, Any]:
        """summary.json's ``wall_time``: every part in seconds, and the steps' share of the total."""
        now = time.time()
        total = now - self.started
        training = now - self._last  # since the last setup mark: steps, saves and what lies between
        rate = self.checkpoint_bytes / self.checkpoint_s / 1e9 if self.checkpoint_s > 0 else None
        return {
            "total_s": total,
            **{f"{phase}_s": seconds for phase, seconds in self.setup.items()},
            "process_group_s": self.process_group_s,
            "steps_s": self.steps_s,
            "steps": self.steps,
            "first_step_s": self.first_step_s,
            "checkpoint_s": self.checkpoint_s,
            "checkpoints": self.checkpoints,
            "checkpoints_written": self.checkpoints,  # the same count, named so it reads as what was written
            "checkpoint_gb": self.checkpoint_bytes / 1e9,
            "checkpoint_gb_per_s": rate,
            "eval_s": self.eval_s,
            "evaluations": self.evaluations,
            "other_s": max(0.0, training - self.steps_s - self.checkpoint_s - self.eval_s),
            "steps_share": self.steps_s / total if total > 0 else None,
            "measured": "rank 0, this attempt, from its command's start",
        }


def wall_parts(wall: WallClock, summary: dict[str, Any] | None = None) -> dict[str, float]:
    """The seconds of ``wall``'s summary (``<part>_s``; not the save rate, ``..._per_s``), for
    runner/metrics/goodput.py's attempt lines."""
    summary = wall.summary() if summary is None else summary
    return {key: value for key, value in summary.items() if key.endswith("_s") and not key.endswith("_per_s")}


def describe(wall: dict[str, Any] | None) -> str | None:
    """One line for the run's end, e.g. ``wall time 31.2 s: steps 24.1 s (77%), launch 4.0 s, ...``."""
    if not wall or not wall.get("total_s"):
        return None
    parts = [f"steps {wall['steps_s']:.1f} s ({100 * (wall.get('steps_share') or 0):.0f}%)"]
    for phase in SETUP_PHASES:
        seconds = wall.get(f"{phase}_s") or 0.0
        if phase not in SHOWN_IF_SPENT or seconds >= 0.05:  # resume: where a checkpoint was loaded
            parts.append(f"{phase} {seconds:.1f} s")
        if phase == "launch" and (wall.get("process_group_s") or 0.0) >= 0.05:
            parts[-1] += f" ({wall['process_group_s']:.1f} s of it joining the process group)"
    if wall.get("checkpoints"):
        rate = wall.get("checkpoint_gb_per_s")
        speed = f", {rate:.2f} GB/s" if rate else ""
        parts.append(
            f"checkpoints {wall['checkpoints']} x {wall['checkpoint_s'] / wall['checkpoints']:.2f} s "
            f"({wall['checkpoint_gb']:.2f} GB{speed})"
        )
    if wall.get("evaluations"):
        parts.append(f"eval {wall['evaluations']} x {wall['eval_s'] / wall['evaluations']:.2f} s")
    parts.append(f"other {wall.get('other_s') or 0.0:.1f} s")
    return f"wall time {wall['total_s']:.1f} s: " + ", ".join(parts)
