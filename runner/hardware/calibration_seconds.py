"""The seconds this process spent measuring its device for the step-time model.

runner/step_time/device_figures.py hands its measuring function through :func:`timed`; the launching
process reads :func:`spent` before its ranks start, and the run's wall time names it as its own
part (runner/metrics/wall_clock.py ``calibration``). Process-wide, as the calibration's cache is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

_Result = TypeVar("_Result")
_spent = [0.0]  # seconds, summed over every figure measured in this process


def timed(measure: Callable[..., _Result]) -> Callable[..., _Result]:
    """``measure``, its seconds added to this process's calibration time at each call."""

    def measured(*args: object, **kwargs: object) -> _Result:
        started = time.perf_counter()
        try:
            return measure(*args, **kwargs)
        finally:
            _spent[0] += time.perf_counter() - started

    return measured


def spent() -> float:
    """Seconds this process has spent measuring its device for the step-time model so far."""
    return _spent[0]
