"""Where a step's time goes: each interval is charged to the phase that ended it.

On a CPU the clock reads ``time.perf_counter``; the tests give it a fake one that moves only
when they say, so the intervals are exact however busy the host is.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fake_clock import FakeClock

from runner.metrics import phase_clock
from runner.metrics.phase_clock import PHASES, PIPELINE_PHASES, PhaseClock

pytestmark = pytest.mark.unit


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(phase_clock, "time", SimpleNamespace(perf_counter=fake))
    return fake


def test_each_interval_goes_to_the_phase_that_ends_it_and_the_phases_partition_the_step(clock):
    phases = PhaseClock(torch.device("cpu"))
    started = clock.now
    phases.start()
    for _ in range(2):  # two micro-batches: their forward and backward times add up
        phases.mark("data")
        clock.sleep(0.02)
        phases.mark("forward")
        clock.sleep(0.04)
        phases.mark("backward")
    clock.sleep(0.01)
    phases.mark("optimizer")
    phases.mark("other")
    step_s = clock.now - started

    seconds = phases.seconds()
    assert set(seconds) == {f"time/{phase}_s" for phase in (*PHASES, "other")}
    assert seconds["time/forward_s"] == pytest.approx(0.04)
    assert seconds["time/backward_s"] == pytest.approx(0.08)
    assert seconds["time/optimizer_s"] == pytest.approx(0.01)
    assert sum(seconds.values()) == pytest.approx(step_s)


def test_a_new_step_forgets_the_last(clock):
    phases = PhaseClock(torch.device("cpu"))
    phases.start()
    clock.sleep(0.02)
    phases.mark("forward")
    phases.start()
    clock.sleep(0.005)
    phases.mark("forward")
    assert phases.seconds()["time/forward_s"] == pytest.approx(0.005)


def test_a_pipeline_clock_has_the_stage_to_stage_phase_and_charges_unknown_marks_to_other(clock):
    phases = PhaseClock(torch.device("cpu"), PIPELINE_PHASES)
    phases.start()
    clock.sleep(0.02)
    phases.mark("p2p")
    clock.sleep(0.01)
    phases.mark("an instruction the clock does not know")
    seconds = phases.seconds()
    assert set(seconds) == {f"time/{phase}_s" for phase in (*PIPELINE_PHASES, "other")}
    assert seconds["time/p2p_s"] == pytest.approx(0.02)
    assert seconds["time/other_s"] == pytest.approx(0.01)
    assert "time/p2p_s" not in PhaseClock(torch.device("cpu")).seconds()
