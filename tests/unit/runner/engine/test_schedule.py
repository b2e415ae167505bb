"""Learning rate: the batch-scaling rules and the warmup/decay shape."""

from __future__ import annotations

import itertools
import math

import pytest

from runner.config import LrScaling, OptimizerConfig, Schedule
from runner.engine.schedule import lr_multiplier, scaled_lr

pytestmark = pytest.mark.unit


def _opt(lr: float, scaling: LrScaling, reference: int | None) -> OptimizerConfig:
    return OptimizerConfig(lr=lr, lr_scaling=scaling, reference_batch=reference)


def test_linear_scaling_matches_goyal_imagenet_recipe() -> None:
    # Goyal et al. 2017, Sec. 2.1 and 5: lr = 0.1 · kn/256, so 3.2 at a batch of 8192.
    assert scaled_lr(_opt(0.1, LrScaling.linear, 256), global_size=8192) == pytest.approx(3.2)
    assert scaled_lr(_opt(0.1, LrScaling.linear, 256), global_size=64) == pytest.approx(0.025)


def test_sqrt_scaling_keeps_update_variance() -> None:
    # Krizhevsky 2014, Sec. 5: lr · sqrt(B / B_ref); 4x the batch doubles the rate.
    assert scaled_lr(_opt(1e-3, LrScaling.sqrt, 256), global_size=1024) == pytest.approx(2e-3)
    assert scaled_lr(_opt(1e-3, LrScaling.sqrt, 256), global_size=128) == pytest.approx(1e-3 / math.sqrt(2))


@pytest.mark.parametrize("scaling", list(LrScaling))
def test_reference_batch_keeps_configured_rate(scaling: LrScaling) -> None:
    assert scaled_lr(_opt(3e-3, scaling, 64), global_size=64) == pytest.approx(3e-3)


def test_rule_none_ignores_batch() -> None:
    assert scaled_lr(_opt(3e-3, LrScaling.none, 16), global_size=1024) == 3e-3


@pytest.mark.parametrize("scaling", [LrScaling.linear, LrScaling.sqrt])
def test_no_reference_means_no_scaling(scaling: LrScaling) -> None:
    assert scaled_lr(_opt(3e-3, scaling, None), global_size=1024) == 3e-3


SHAPE = dict(warmup_steps=10, total_steps=60, min_lr_ratio=0.1)


@pytest.mark.parametrize("schedule", list(Schedule))
def test_warmup_is_linear_to_peak(schedule: Schedule) -> None:
    factors = [lr_multiplier(step, schedule=schedule, **SHAPE) for step in range(10)]  # type: ignore[arg-type]
    assert factors == pytest.approx([(step + 1) / 10 for step in range(10)])


def test_constant_holds_peak_after_warmup() -> None:
    factors = [lr_multiplier(s, schedule=Schedule.constant, **SHAPE) for s in range(10, 60)]  # type: ignore[arg-type]
    assert factors == [1.0] * 50


def test_cosine_decays_monotonically_from_peak() -> None:
    factors = [lr_multiplier(s, schedule=Schedule.cosine, **SHAPE) for s in range(10, 60)]  # type: ignore[arg-type]
    assert factors[0] == pytest.approx(1.0)
    assert all(later <= earlier for earlier, later in itertools.pairwise(factors))
    assert min(factors) >= 0.1
    # A cosine in the step (SGDR eq. 5): inverting f = min + (1 - min)·½(1 + cos πp) gives a
    # progress p that starts at 0 and grows by the same amount every step.
    progress = [math.acos(2 * (f - 0.1) / 0.9 - 1) / math.pi for f in factors]
    increments = [later - earlier for earlier, later in itertools.pairwise(progress)]
    assert progress[0] == pytest.approx(0.0, abs=1e-6)
    assert increments == pytest.approx([increments[0]] * len(increments), rel=1e-6)


def test_cosine_reaches_min_lr_ratio_at_last_step() -> None:
    # config.py: "cosine decays to lr * min_lr_ratio at the last step"; runner/train/rank.py trains
    # steps 0 .. train.steps - 1 with the rate lr_multiplier(step) gives.
    assert lr_multiplier(59, schedule=Schedule.cosine, **SHAPE) == pytest.approx(0.1)  # type: ignore[arg-type]
