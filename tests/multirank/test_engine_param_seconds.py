"""DeepSpeed's per-parameter-tensor overhead measured with DeepSpeed itself: one rank, an engine at
every ZeRO stage, in a child process (runner/step_time/measured/zero3_overhead.py ``engine_param_seconds``).
What the planner does with the figures is tests/unit/runner/plan/test_calibrate_zero3.py's."""

from __future__ import annotations

import pytest

from runner.step_time.measured import zero3_overhead as calibrate_zero3

pytestmark = pytest.mark.multirank


def test_the_engine_overhead_is_measured_with_deepspeed() -> None:
    """One DeepSpeed child (about 10 s here): the engine adds at most a few milliseconds per
    tensor and micro-batch on a CPU at every stage, never 50 ms; ZeRO-3 (its gathers and
    releases) adds far more than stages 0-2 (about 1 ms against at most 0.1 ms here), and some
    seconds per GB for a larger tensor. With every tensor persistent (nothing gathered) stage 3
    still pays its hooks over stage 0's. Only orders of magnitude are asserted: the differences
    of timings closer than that (stage 3 against all-persistent stage 3, the per-byte figure)
    can turn on a busy host."""
    seconds = calibrate_zero3.engine_param_seconds(device_type="cpu", threads=1)
    assert seconds is not None, "the child failed: run python -m runner.step_time.measured.zero3_overhead"
    per_byte = seconds.pop(calibrate_zero3.BYTE_KEY)
    assert set(seconds) == {"0", "1", "2", "3", calibrate_zero3.PERSISTENT_KEY}
    assert all(0 <= value < 0.05 for value in seconds.values())
    assert seconds["3"] > 3 * max(seconds["0"], seconds["1"], seconds["2"]), seconds
    assert seconds[calibrate_zero3.PERSISTENT_KEY] > 3 * seconds["0"], seconds
    assert 0 <= per_byte * 1e9 < 100
