"""train.on_nonfinite: what a NaN/inf loss does to the run (runner/train/nonfinite.py)."""

from __future__ import annotations

import pytest

from runner.config import OnNonFinite
from runner.train.nonfinite import NonFiniteGuard

pytestmark = pytest.mark.unit


def test_stop_raises_with_the_fix():
    guard = NonFiniteGuard(OnNonFinite.stop, max_skipped=10)
    assert guard.should_skip(2.5, step=0) is False
    with pytest.raises(FloatingPointError, match=r"loss is nan at step 3.*train.on_nonfinite=skip"):
        guard.should_skip(float("nan"), step=3)


def test_skip_counts_until_the_cap_then_stops():
    guard = NonFiniteGuard(OnNonFinite.skip, max_skipped=2, skipped=[1])  # one skip before a resume
    assert guard.should_skip(float("inf"), step=4) is True
    assert guard.should_skip(3.0, step=5) is False
    with pytest.raises(FloatingPointError, match=r"after 2 skipped steps \[1, 4\].*max_skipped_steps=2"):
        guard.should_skip(float("nan"), step=6)
    assert guard.summary() == {"policy": "skip", "count": 2, "steps": [1, 4]}
