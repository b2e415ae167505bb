"""Where a step's time goes: each interval is charged to the phase that ended it."""

from __future__ import annotations

import time

import pytest
import torch

from runner.metrics.phase_clock import PHASES, PIPELINE_PHASES, PhaseClock

pytestmark = pytest.mark.unit


def test_each_interval_goes_to_the_phase_that_ends_it_and_the_phases_partition_the_step():
    clock = PhaseClock(torch.device("cpu"))
    started = time.perf_counter()
    clock.start()
    for _ in range(2):  # two micro-batches: their forward and backward times add up
        clock.mark("data")
        time.sleep(0.02)
        clock.mark("forward")
        time.sleep(0.04)
        clock.mark("backward")
    clock.mark("optimizer")
    clock.mark("other")
    step_s = time.perf_counter() - started

    seconds = clock.seconds()
    assert set(seconds) == {f"time/{phase}_s" for phase in (*PHASES, "other")}
    assert seconds["time/forward_s"] >= 0.04
    assert seconds["time/backward_s"] >= 0.08
    assert sum(seconds.values()) == pytest.approx(step_s, abs=0.005)


def test_a_new_step_forgets_the_last():
    clock = PhaseClock(torch.device("cpu"))
    clock.start()
    time.sleep(0.02)
    clock.mark("forward")
    clock.start()
    clock.mark("forward")
    assert clock.seconds()["time/forward_s"] < 0.02


def test_a_pipeline_clock_has_the_stage_to_stage_phase_and_charges_unknown_marks_to_other():
    clock = PhaseClock(torch.device("cpu"), PIPELINE_PHASES)
    clock.start()
    time.sleep(0.02)
    clock.mark("p2p")
    time.sleep(0.01)
    clock.mark("an instruction the clock does not know")
    seconds = clock.seconds()
    assert set(seconds) == {f"time/{phase}_s" for phase in (*PIPELINE_PHASES, "other")}
    assert seconds["time/p2p_s"] >= 0.02
    assert seconds["time/other_s"] >= 0.01
    assert "time/p2p_s" not in PhaseClock(torch.device("cpu")).seconds()
