"""A run the plan says will not fit starts all the same, with a warning that names the numbers."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_a_run_that_will_not_fit_warns_before_launch_and_records_it(train):
    # 0.05 GB of device memory: the tiny model's 0.1 GB plan does not fit.
    result = train(
        "batch.micro_size=8",
        "cluster.device_memory_gb=0.05",
        "train.steps=1",
        "logger=none",
        "data=synthetic",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = result.summary["plan_warnings"]
    assert len(warnings) == 1 and "more than its 0.0 GB usable" in warnings[0], warnings
    assert "plan: the plan puts 0.1 GB on each device" in result.stdout


def test_a_run_that_fits_has_no_warning(train):
    result = train("train.steps=1", "logger=none", "data=synthetic")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["plan_warnings"] == []
