"""How much a run's step times vary: a cell whose steps spread widely was measured on a busy machine.

On a shared host (a CPU most of all) another process can take a core for some steps, and
those steps run slower: the run's tokens/s and MFU are then the machine's load as much as
the layout's. The spread is the interquartile range of the step times over their
median, after the first step (its one-time costs: allocation, kernels' first dispatch),
the steps the report's medians use too. Above NOISY_ABOVE the cell is flagged noisy.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from runner.rundir.summary_records import StepTimeSpread

# IQR / median above which a cell's speed is called noisy: a quarter of the median. On a quiet
# 2-core host the tiny model's 60 steps spread 10%; beside other training on the same cores,
# 69-72% (steps of 0.35 s took 2-10 s).
NOISY_ABOVE = 0.25
WARMUP_STEPS = 1  # the steps left out at the start: the report's medians leave out the first too
MIN_STEPS = 3  # fewer measured steps have no quartiles worth the name


def iqr_over_median(seconds: Sequence[float]) -> float | None:
    """(Q3 - Q1) / median of ``seconds`` (quartiles as numpy's default, linear), or None for too few."""
    if len(seconds) < MIN_STEPS:
        return None
    q1, median, q3 = statistics.quantiles(seconds, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else None


def step_time_spread(step_s: Sequence[float], *, warmup: int = WARMUP_STEPS) -> StepTimeSpread | None:
    """summary.json's ``step_time_spread`` of an attempt's step times in order (None: too few steps)."""
    kept = list(step_s[warmup:])
    spread = iqr_over_median(kept)
    if spread is None:
        return None
    return {
        "iqr_over_median": spread,
        "noisy": spread > NOISY_ABOVE,
        "steps": len(kept),
        "warmup_steps": warmup,
        "noisy_above": NOISY_ABOVE,
    }


def describe(spread: StepTimeSpread | None) -> str | None:
    """One line for a noisy run's end, or None where the steps were steady (or too few)."""
    if not spread or not spread.get("noisy"):
        return None
    return (
        f"noisy: the step times' interquartile range is {100 * spread['iqr_over_median']:.0f}% of their "
        f"median over {spread['steps']} steps (above {100 * NOISY_ABOVE:.0f}%): another process shared "
        "the cores, so this run's tokens/s and MFU are not comparable with a quiet run's"
    )
