"""A cell whose step times vary more than a quarter of their median (IQR, after the first step) is noisy."""

from __future__ import annotations

import pytest

from runner.metrics import step_spread
from runner.metrics.step_spread import NOISY_ABOVE, step_time_spread
from runner.metrics.wall_clock import WallClock

pytestmark = pytest.mark.unit

STEADY = [3.0, 0.50, 0.51, 0.49, 0.50, 0.52, 0.50, 0.48, 0.50]  # the first step's warm-up left out
SHARED = [3.0, 0.50, 0.95, 0.52, 1.02, 0.49, 0.98, 0.50, 0.51]  # another process on a core, now and then


def test_steady_steps_are_not_noisy_even_after_a_slow_first_step():
    spread = step_time_spread(STEADY)
    assert spread is not None
    assert spread["iqr_over_median"] == pytest.approx(0.005 / 0.50)  # Q1 0.4975, Q3 0.5025
    assert spread["noisy"] is False and spread["steps"] == 8 and spread["warmup_steps"] == 1


def test_steps_on_a_shared_machine_are_noisy():
    spread = step_time_spread(SHARED)
    assert spread is not None and spread["iqr_over_median"] > NOISY_ABOVE
    assert spread["noisy"] is True
    assert "not comparable" in (step_spread.describe(spread) or "")
    assert step_spread.describe(step_time_spread(STEADY)) is None


def test_the_threshold_is_a_quarter_of_the_median():
    at = [9.0, 1.0, 0.75, 1.25, 0.875, 1.125]  # Q1 0.875, Q3 1.125: IQR 0.25 = a quarter of the median
    over = [9.0, 1.0, 0.7, 1.3, 0.86, 1.14]  # IQR 0.28
    assert step_time_spread(at)["iqr_over_median"] == pytest.approx(0.25)  # type: ignore[index]
    assert step_time_spread(at)["noisy"] is False  # type: ignore[index]
    assert step_time_spread(over)["noisy"] is True  # type: ignore[index]


def test_too_few_steps_have_no_spread():
    assert step_time_spread([2.0, 0.5, 0.5]) is None  # two steps after the first
    assert step_time_spread([2.0, 0.5, 0.5, 0.6]) is not None


def test_the_wall_clock_keeps_each_steps_seconds():
    wall = WallClock(started=0.0)
    for seconds in SHARED:
        wall.step(seconds)
    assert list(wall.step_times) == SHARED
    assert wall.summary()["checkpoints_written"] == wall.summary()["checkpoints"] == 0
