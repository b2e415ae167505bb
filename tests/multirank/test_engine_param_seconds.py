"""DeepSpeed's per-parameter-tensor overhead measured with DeepSpeed itself: one rank, an engine at
every ZeRO stage, in a child process (runner/plan/calibrate_zero3.py ``engine_param_seconds``).
What the planner does with the figures is tests/unit/runner/plan/test_calibrate_zero3.py's."""

from __future__ import annotations

import pytest

from runner.plan import calibrate_zero3

pytestmark = pytest.mark.multirank


def test_the_engine_overhead_is_measured_with_deepspeed() -> None:
    """One DeepSpeed child (about 10 s here): the engine adds at most a few milliseconds per
    tensor and micro-batch on a CPU at every stage, never 50 ms; ZeRO-3 (its gathers and
    releases) adds the most, and more for a larger tensor: some seconds per GB. With every
    tensor persistent (nothing gathered) stage 3 still pays its hooks over stage 0's."""
    seconds = calibrate_zero3.engine_param_seconds(device_type="cpu", threads=1)
    assert seconds is not None, "the child failed: run python -m runner.plan.calibrate_zero3"
    per_byte = seconds.pop(calibrate_zero3.BYTE_KEY)
    assert set(seconds) == {"0", "1", "2", "3", calibrate_zero3.PERSISTENT_KEY}
    assert all(0 <= value < 0.05 for value in seconds.values())
    assert seconds["3"] == max(seconds.values()) > 0
    assert seconds[calibrate_zero3.PERSISTENT_KEY] > seconds["0"]
    assert 0 < per_byte * 1e9 < 100
