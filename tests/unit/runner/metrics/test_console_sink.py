"""The console's step line and live display: step (from 1), loss, lr, step time, tokens/s, MFU, peak
and the time left; on a terminal redrawn in place, in a log at a readable rate."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from runner.config import LoggerConfig
from runner.metrics.console import PLAIN_EVERY_S, ConsoleSink, clock_time
from runner.metrics.sinks import build_sinks

pytestmark = pytest.mark.unit


class FakeTerminal(io.StringIO):
    """What rich and the sink take for a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def metrics(step_s: float = 0.5, **extra: float) -> dict[str, float]:
    return {
        "loss": 2.9142,
        "lr": 3e-4,
        "time/step_s": step_s,
        "throughput/tokens_per_s": 1332.4,
        "throughput/mfu": 0.301,
        "memory/peak_gb": 0.734,
        "grad_norm": 1.0,  # not shown
        **extra,
    }


def run(
    sink: ConsoleSink, clock: Clock, steps: int, *, step_s: float = 0.5, slow: dict[int, float] | None = None
):
    for step in range(steps):
        seconds = (slow or {}).get(step, step_s)
        clock.now += seconds
        sink.log(step, metrics(seconds))


def test_a_plain_line_has_every_field_and_counts_from_one():
    out, clock = io.StringIO(), Clock()
    sink = ConsoleSink(60, out=out, clock=clock)
    clock.now = 0.5
    sink.log(0, metrics())
    assert out.getvalue() == (
        "step 1/60  loss 2.9142  lr 3.00e-04  0.5 s/step  1,332 tok/s  MFU 30.1%  peak 0.73 GB  ETA 0:30\n"
    )


def test_plain_lines_come_at_a_readable_rate_with_the_first_the_last_and_each_evaluation():
    """60 steps of 0.5 s, each logged: a line at the first step, then one per PLAIN_EVERY_S, and the last."""
    out, clock = io.StringIO(), Clock()
    sink = ConsoleSink(60, out=out, clock=clock)
    for step in range(60):
        clock.now += 0.5
        sink.log(step, metrics(**({"eval/loss": 3.1} if step == 32 else {})))
    shown = [int(m) for m in re.findall(r"^step (\d+)/60", out.getvalue(), re.M)]
    every = int(PLAIN_EVERY_S / 0.5)
    assert shown == [1, 1 + every, 33, 33 + every, 60]
    assert "eval 3.1000" in out.getvalue().splitlines()[2]


def test_the_time_left_follows_the_median_pace_so_one_slow_step_moves_it_little():
    out, clock = io.StringIO(), Clock()
    sink = ConsoleSink(20, out=out, clock=clock)
    run(sink, clock, 19, step_s=1.0, slow={9: 12.0})  # another process took the cores for one step
    sink.log(19, metrics(1.0))  # the last step: always a line
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("ETA 0:19")  # after the first step: its own time, 19 steps left
    assert re.search(r"^step 10/20 .* 12 s/step .* ETA 0:10$", lines[1])  # 10 left at the median 1 s
    assert lines[-1].endswith("ETA 0:00")


def test_a_terminal_gets_a_live_display_with_the_same_fields():
    terminal, clock = FakeTerminal(), Clock()
    sink = ConsoleSink(60, out=terminal, clock=clock)
    run(sink, clock, 60)
    sink.close({})
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())  # the escape codes that redraw
    last_frame = screen.rsplit("step 60/60", 1)[1]
    assert "ETA 0:00" in last_frame
    assert "loss 2.9142  lr 3.00e-04  0.5 s/step  1,332 tok/s  MFU 30.1%  peak 0.73 GB" in last_frame
    assert "━" in last_frame  # the bar
    assert not re.search(r"^step \d+/60  loss", screen, re.M)  # no plain line on a terminal


@pytest.mark.parametrize(
    ("seconds", "shown"), [(21, "0:21"), (20.2, "0:21"), (725, "12:05"), (10937, "3:02:17")]
)
def test_time_left_reads_as_a_clock(seconds, shown):
    assert clock_time(seconds) == shown


def test_logger_progress_false_prints_nothing(tmp_path):
    sinks = build_sinks(
        LoggerConfig(name="none", progress=False),
        run_dir=tmp_path,
        total_steps=4,
        name="run",
        group=None,
        config={},
        run_id="x",
    )
    assert [type(s).__name__ for s in sinks] == ["JsonlSink"]
    for sink in sinks:
        sink.close({})


def test_lines_logged_under_the_live_display_print_above_it_not_under_it(monkeypatch):
    """A checkpoint's log line while the display shows: printed through the display (above it),
    not written over by its next redraw; the handler writes where it did once the display stops."""
    terminal, clock = FakeTerminal(), Clock()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    handler = logging.StreamHandler(sys.stderr)
    logger = logging.getLogger("ladder.test_console")
    logger.addHandler(handler)
    try:
        sink = ConsoleSink(4, out=terminal, clock=clock)
        logger.warning("before the first step")  # the display has not started: as it always printed
        run(sink, clock, 2)
        logger.warning("checkpoint step_00000002: 0.039 GB in 0.21 s")
        for step in (2, 3):
            sink.log(step, metrics())
        sink.close({})
        assert handler.stream is sys.stderr
    finally:
        logger.removeHandler(handler)
    assert "before the first step" in sys.stderr.getvalue()
    assert "checkpoint step_00000002" in terminal.getvalue()
    assert "checkpoint step_00000002" not in sys.stderr.getvalue()
