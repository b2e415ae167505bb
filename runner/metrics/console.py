"""Rank 0's progress on the console: a live display on a terminal, plain lines in a log.

Both show the same fields of a logged step, counted from 1 as a person counts (step index 0
is ``step 1/60``), as ``python train.py`` printed them on a 2-core CPU::

    step 29/60  loss 2.6896  lr 2.20e-03  0.35 s/step  5,849 tok/s  MFU 59.4%  peak 0.66 GB  ETA 0:12

On a terminal the display redraws in place. Without one (a file, a pipe, a SLURM job's
output) each logged step (``logger.log_every``) may print a line, but at most one every
PLAIN_EVERY_S seconds, besides the first step, the last and each held-out evaluation, so a
log stays readable at any step rate.

The time left (ETA) is the steps left times the median of the seconds per step between the
latest logged steps: the wall clock's, so checkpoints and evaluations are in it, and a
single slow step (another process on the cores) moves it little.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

# One field of the step's line: the metric's name and its format.
FIELDS = (
    ("loss", "loss {:.4f}"),
    ("eval/loss", "eval {:.4f}"),
    ("lr", "lr {:.2e}"),
    ("time/step_s", "{:.3g} s/step"),
    ("throughput/tokens_per_s", "{:,.0f} tok/s"),
    ("throughput/mfu", "MFU {:.1%}"),
    ("memory/peak_gb", "peak {:.2f} GB"),
)
PLAIN_EVERY_S = 10.0  # the least seconds between two plain lines (first, last and evaluations aside)
PACE_WINDOW = 16  # the latest intervals between logged steps that the time left is estimated from


def clock_time(seconds: float) -> str:
    """``0:21``, ``12:05``, ``3:02:17``: seconds as a clock reads, rounded up."""
    whole = int(-(-seconds // 1))  # ceil: a run never ends before its estimate says
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Pace:
    """Seconds per step from the wall clock between logged steps; the time left from them."""

    def __init__(self, total_steps: int, clock: Callable[[], float]) -> None:
        self._total = total_steps
        self._clock = clock
        self._last: tuple[int, float] | None = None  # (step, when it was logged)
        self._per_step: deque[float] = deque(maxlen=PACE_WINDOW)

    def logged(self, step: int, step_s: float | None) -> float | None:
        """Note that ``step`` was logged now; the seconds left to the last step (None: not known yet)."""
        now = self._clock()
        if self._last is not None and step > self._last[0]:
            self._per_step.append((now - self._last[1]) / (step - self._last[0]))
        self._last = (step, now)
        per_step = statistics.median(self._per_step) if self._per_step else step_s
        if per_step is None:
            return None
        return max(0, self._total - step - 1) * per_step


def step_fields(metrics: dict[str, float]) -> str:
    """The step's measured fields, e.g. ``loss 2.9142  lr 3.00e-04  0.412 s/step  ...  peak 0.73 GB``."""
    return "  ".join(fmt.format(metrics[key]) for key, fmt in FIELDS if key in metrics)


def eta_field(eta_s: float | None) -> str:
    """``ETA 0:21``; empty while the time left is unknown."""
    return "" if eta_s is None else f"ETA {clock_time(eta_s)}"


class ConsoleSink:
    """Progress on rank 0: a live display on a terminal, plain lines at a readable rate otherwise."""

    def __init__(
        self, total_steps: int, *, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._total = total_steps
        self._out = out if out is not None else sys.stdout
        self._clock = clock
        self._pace = Pace(total_steps, clock)
        self._printed_at: float | None = None  # when the latest plain line was printed
        self._live = _LiveDisplay(self._out, total_steps) if self._out.isatty() else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Redraw the display, or print a line when one is due."""
        eta = eta_field(self._pace.logged(step, metrics.get("time/step_s")))
        fields = step_fields(metrics)
        if self._live is not None:
            self._live.update(step + 1, fields, eta)
            return
        now = self._clock()
        due = self._printed_at is None or now - self._printed_at >= PLAIN_EVERY_S
        if due or step + 1 == self._total or "eval/loss" in metrics:
            line = "  ".join(part for part in (f"step {step + 1}/{self._total}", fields, eta) if part)
            print(line, file=self._out, flush=True)
            self._printed_at = now

    def close(self, summary: dict[str, Any]) -> None:
        """Leave the display's last state on the screen."""
        if self._live is not None:
            self._live.stop()


class _LiveDisplay:
    """Two lines redrawn in place at each logged step: the step, a bar and the time left; the metrics.

    It starts at the first logged step, so the lines a rank logs while it sets up print as they
    did. While it shows, what the process prints or logs to the terminal goes above it: rich
    redirects sys.stdout and sys.stderr, and the logging handlers that write to them (rank 0's
    own, launchers/worker.py; DeepSpeed's) are pointed at the redirection until it stops, so a
    checkpoint's line is not drawn over.
    """

    def __init__(self, out: TextIO, total_steps: int) -> None:
        self._out = out
        self._total = total_steps
        self._live: Any = None
        self._moved: list[tuple[logging.StreamHandler[Any], Any]] = []  # handlers and their own streams

    def _start(self) -> None:
        # deferred: only a terminal shows the live display
        from rich.console import Console
        from rich.live import Live

        before = {id(sys.stdout): "stdout", id(sys.stderr): "stderr"}
        # Redrawn when a step is logged, not on a timer: nothing else on it changes.
        self._live = Live(console=Console(file=self._out), auto_refresh=False)
        self._live.start()
        for handler in _stream_handlers():
            name = before.get(id(handler.stream))
            if name is not None:
                self._moved.append((handler, handler.setStream(getattr(sys, name))))

    def update(self, done: int, fields: str, eta: str) -> None:
        """Show ``done`` steps, the time left beside the bar and the step's fields under it."""
        # deferred: only a terminal shows the live display
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        if self._live is None:
            self._start()
        head = Table.grid(padding=(0, 1))
        head.add_row(
            Text(f"step {done}/{self._total}", style="bold"),
            ProgressBar(total=self._total, completed=done, width=30, finished_style="green"),
            Text(eta),
        )
        self._live.update(Group(head, Text(fields)), refresh=True)

    def stop(self) -> None:
        """Stop redrawing; the last state stays on the screen, and the handlers write where they did."""
        if self._live is None:
            return
        self._live.stop()
        for handler, stream in self._moved:
            handler.setStream(stream)
        self._moved.clear()


def _stream_handlers() -> list[logging.StreamHandler[Any]]:
    """Every logging handler that writes to a stream (not a file), the root logger's included."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [
        handler
        for logger in loggers
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
    ]
