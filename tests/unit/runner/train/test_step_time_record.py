"""summary.json's step_time: the plan's predicted step, recorded at launch, gets the attempt's
measured step and the model's error at the run's end, so every run checks the step-time model."""

from __future__ import annotations

import pytest

from runner.train.attempt_end import measured_step_time

pytestmark = pytest.mark.unit

PREDICTED = {
    "predicted_s": 0.4,
    "predicted_is_lower_bound": False,
    "terms_s": {"gemm": 0.3, "optimizer": 0.1},
    "limit": "gemm",
    "bound_s": 0.25,
    "calibration": "measured on this host",
}


def test_the_end_adds_the_median_step_after_the_first_and_the_error_keeping_the_prediction():
    # PREDICTED: what the launching process wrote. The first step (allocation, first dispatch)
    # is left out: the median of 0.5, 0.6, 0.5.
    record = measured_step_time(PREDICTED, [7.0, 0.5, 0.6, 0.5])
    assert record is not None
    assert record["measured_s"] == 0.5 and record["measured_steps"] == 3
    assert record["error"] == pytest.approx((0.4 - 0.5) / 0.5)  # predicted 20% fast
    assert {key: record[key] for key in PREDICTED} == PREDICTED


def test_a_run_without_a_prediction_records_the_measured_step_and_no_error():
    record = measured_step_time(None, [7.0, 0.5, 0.7])
    assert record == {"measured_s": 0.6, "measured_steps": 2, "error": None}


def test_a_single_step_measures_nothing_and_leaves_the_prediction_as_it_was():
    assert measured_step_time(PREDICTED, [7.0]) == PREDICTED
    assert measured_step_time(None, [7.0]) is None
