"""A run's time across its attempts: how much of it trained the model that came out.

A run stopped and resumed (Ctrl-C, a SLURM time limit or preemption, a crash, a node lost)
is several attempts in one run directory. Each attempt's own wall time is
runner/metrics/wall_clock.py's; this adds them up. Rank 0 appends to ``attempts.jsonl`` when an
attempt starts its first step (its process's start time and the step it resumed from),
after each checkpoint, after each step it logs (at most once every ``PROGRESS_EVERY_S``),
and when it ends; each line after the start carries its wall time's parts so far (start-up
phases, steps, checkpoints, evaluations). An attempt killed outright (SIGKILL, the kernel's OOM
killer, a lost node) writes no end: its last line is the latest it is known to have lived, and
its parts are those of that line.

Goodput is "the fraction of time spent making productive progress" on the model (Google
Cloud, "ML Goodput measurement", 2024: productive training time over the job's time).
Here the productive time is that of the steps the final model descends from: the steps of
attempt i from its ``from_step`` up to the step a later attempt resumed from; the steps
after that checkpoint were trained again (``lost``). ``goodput`` divides by the attempts'
wall time, ``goodput_elapsed`` by the time from the first attempt's start to the last one's
end, which adds the time between attempts (queueing, restarts).

A resume onto another layout converts the checkpoint first (launchers/run.py); the process that
converts appends a ``conversion`` line (its end, seconds and bytes; no attempt number: it comes
before the attempt's start line). ladder's own launcher converts before it starts the ranks, so
between attempts; torchrun's and srun's rank 0 converts in its start-up (wall_clock's
``launch``). ``conversion_s`` names that time, and where it fell.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runner.metrics.wall_clock import SETUP_PHASES
from runner.rundir.run_files import ATTEMPTS_FILE
from runner.rundir.summary import RunStatus
from runner.rundir.summary_records import GoodputAttempt, GoodputRecord

NO_END = "no end recorded (killed outright)"
PROGRESS_EVERY_S = 1.0  # at most one progress line a second: a killed attempt is known to within it


def _append(run_dir: Path, record: dict[str, Any]) -> None:
    """One line, written whole (one write on an O_APPEND file, as metrics.jsonl)."""
    fd = os.open(run_dir / ATTEMPTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a full disk: the rest still count
            continue
    return records


def record_conversion(run_dir: Path, *, seconds: float, size: int, tag: str) -> None:
    """The line of a checkpoint converted for this attempt's layout, written as it ends."""
    line = {"event": "conversion", "time": time.time(), "seconds": seconds, "bytes": size, "tag": tag}
    _append(run_dir, line)


class AttemptLog:
    """Rank 0's lines in ``attempts.jsonl`` for this attempt: its start, progress and end."""

    def __init__(self, run_dir: Path, *, started: float, from_step: int, launcher: str) -> None:
        self.run_dir = run_dir
        numbers = (int(r["attempt"]) for r in _lines(run_dir / ATTEMPTS_FILE) if "attempt" in r)
        self.number = 1 + max(numbers, default=-1)
        self._written = time.time()
        self._write("start", started=started, from_step=from_step, launcher=launcher)

    def _write(self, event: str, **fields: Any) -> None:
        self._written = time.time()
        _append(self.run_dir, {"attempt": self.number, "event": event, "time": self._written, **fields})

    def progress(
        self,
        completed_steps: int,
        steps_s: float,
        *,
        saved: bool,
        logged: bool,
        parts: Callable[[], dict[str, float]],
    ) -> None:
        """After a step: a line at each checkpoint, and at a logged step PROGRESS_EVERY_S after the last,
        with the wall time's parts so far (``parts()``, asked only when a line is written)."""
        if saved or (logged and time.time() - self._written >= PROGRESS_EVERY_S):
            event = "checkpoint" if saved else "progress"
            self._write(event, step=completed_steps, steps_s=steps_s, parts=parts())

    def end(
        self, *, status: RunStatus, steps_completed: int, steps_s: float, parts: dict[str, float]
    ) -> None:
        """How the attempt ended, the steps it completed, its steps' wall time and its other parts
        (runner/metrics/wall_clock.py's start-up phases, checkpoints, evaluations: ``<part>_s``)."""
        self._write("end", status=status, step=steps_completed, steps_s=steps_s, parts=parts)


def _attempt(events: list[dict[str, Any]]) -> GoodputAttempt | None:
    """One attempt's times and steps from its lines; a killed one's from its last progress."""
    start = next((e for e in events if e["event"] == "start"), None)
    if start is None:
        return None
    began, from_step = float(start["started"]), int(start["from_step"])
    last = events[-1]
    ended = last["event"] == "end"
    # The parts of its last line that has them (older files' progress lines have none).
    parts = next((dict(e["parts"]) for e in reversed(events) if e.get("parts")), {})
    wall_s = max(0.0, float(last["time"]) - began)
    recorded = float(parts["total_s"]) if "total_s" in parts else float(last.get("steps_s", 0.0))
    return {
        "attempt": int(start["attempt"]),
        "status": str(last["status"]) if ended else NO_END,
        "launcher": start.get("launcher"),
        "started": began,
        "ended": float(last["time"]),
        "wall_s": wall_s,
        "from_step": from_step,
        "to_step": int(last.get("step", from_step)),
        "steps_s": float(last.get("steps_s", 0.0)),
        "parts": parts,
        "unrecorded_s": 0.0 if ended else max(0.0, wall_s - recorded),
    }


def account(run_dir: Path) -> GoodputRecord | None:
    """summary.json's ``goodput``: each attempt, the steps and time kept and lost, and the ratios."""
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    conversions = []
    for event in _lines(run_dir / ATTEMPTS_FILE):
        if event["event"] == "conversion":
            conversions.append(event)
        elif "attempt" in event:
            by_attempt.setdefault(int(event["attempt"]), []).append(event)
    attempts = [a for a in (_attempt(by_attempt[n]) for n in sorted(by_attempt)) if a is not None]
    if not attempts:
        return None
    # The final model descends from the last attempt's steps, the steps of the one before up to
    # where the last resumed, and so on back: each earlier attempt's steps count below every
    # later attempt's from_step.
    frontier = math.inf
    for attempt in reversed(attempts):
        done = attempt["to_step"] - attempt["from_step"]
        kept = max(0, min(attempt["to_step"], frontier) - attempt["from_step"])
        per_step = attempt["steps_s"] / done if done > 0 else 0.0
        # ints: the frontier starts at inf, and min() keeps the int it picks
        attempt |= {"steps_kept": int(kept), "steps_lost": int(max(0, done - kept))}
        attempt |= {"kept_s": per_step * kept, "lost_s": per_step * max(0, done - kept)}
        frontier = min(frontier, attempt["from_step"])
    wall = sum(a["wall_s"] for a in attempts)
    elapsed = attempts[-1]["ended"] - attempts[0]["started"]
    kept_s = sum(a["kept_s"] for a in attempts)
    # Each part summed over the attempts; of an attempt killed outright, what its last line with
    # parts recorded (the rest of its span, or all but its steps without such a line, is unrecorded).
    parts: dict[str, float] = {}
    for attempt in attempts:
        for part, seconds in attempt["parts"].items():
            parts[part] = parts.get(part, 0.0) + float(seconds or 0.0)
    startup = sum(parts.get(f"{phase}_s", 0.0) for phase in SETUP_PHASES)
    unrecorded = sum(a["unrecorded_s"] for a in attempts)
    converted = _conversions(conversions, attempts)
    return {
        "attempts": attempts,
        "wall_s": wall,
        "parts_s": parts,
        "startup_s": startup,
        "unrecorded_s": max(0.0, unrecorded),
        "between_attempts_s": max(0.0, elapsed - wall),
        "conversion_s": converted["conversion_s"],
        "conversion_between_attempts_s": converted["conversion_between_attempts_s"],
        "kept_s": kept_s,
        "lost_s": sum(a["lost_s"] for a in attempts),
        "steps_lost": sum(a["steps_lost"] for a in attempts),
        "goodput": kept_s / wall if wall > 0 else None,
        "goodput_elapsed": kept_s / elapsed if elapsed > 0 else None,
        "measured": "rank 0, every attempt in this run directory (attempts.jsonl)",
    }


def _conversions(lines: list[dict[str, Any]], attempts: list[GoodputAttempt]) -> dict[str, float]:
    """The seconds spent converting checkpoints for a new layout, all told, and those between
    attempts: a conversion that ended while no attempt's process was running (torchrun's rank 0
    converts in its own start-up, so within its attempt's span)."""

    def between(line: dict[str, Any]) -> bool:
        return not any(a["started"] <= float(line["time"]) <= a["ended"] for a in attempts)

    return {
        "conversion_s": sum(float(line["seconds"]) for line in lines),
        "conversion_between_attempts_s": sum(float(line["seconds"]) for line in lines if between(line)),
    }


def describe(goodput: Mapping[str, Any] | None) -> str | None:
    """One line for the run's end, where it took more than one attempt."""
    if not goodput or len(goodput.get("attempts") or []) < 2:
        return None
    share = goodput.get("goodput")
    words = [
        f"goodput over {len(goodput['attempts'])} attempts: "
        + (f"{share:.0%}" if share is not None else "n/a")
        + f" ({goodput['kept_s']:.1f} s of kept steps in {goodput['wall_s']:.1f} s of attempts)"
    ]
    if goodput.get("steps_lost"):
        words.append(f"{goodput['steps_lost']} steps trained again ({goodput['lost_s']:.1f} s)")
    among = goodput.get("conversion_between_attempts_s", 0.0)
    within = goodput.get("conversion_s", 0.0) - among  # converted in a rank's start-up
    if goodput.get("startup_s"):
        words.append(f"start-up {goodput['startup_s']:.1f} s" + _converting(within))
    if goodput.get("unrecorded_s", 0.0) >= 0.05:
        words.append(f"{goodput['unrecorded_s']:.1f} s beyond the steps of attempts killed outright")
    if goodput.get("between_attempts_s", 0.0) >= 0.05:
        words.append(f"{goodput['between_attempts_s']:.1f} s between attempts" + _converting(among))
    return "; ".join(words)


def _converting(seconds: float) -> str:
    return f" ({seconds:.1f} s of it converting the checkpoint to a new layout)" if seconds >= 0.05 else ""
