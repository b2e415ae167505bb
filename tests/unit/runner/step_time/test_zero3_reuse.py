"""runner/step_time/zero3_reuse.py: what ZeRO-3 gathers again in backward, as DeepSpeed 0.19.8 decides it."""

from __future__ import annotations

import pytest
from train_helpers import compose_config

from runner.model.shape import param_numels
from runner.plan.planner import plan_config
from runner.step_time.zero3_reuse import MAX_REUSE_DISTANCE, regathered

pytestmark = pytest.mark.unit


def test_a_small_model_keeps_every_gathered_parameter_until_its_backward():
    numels = [1000, *[300] * 9, 10]  # all of it far under the reuse distance
    assert regathered(numels, 100, tied=True) == (0, 0)


def test_a_parameter_is_gathered_again_when_the_modules_after_it_pass_the_reuse_distance():
    block = MAX_REUSE_DISTANCE // 8
    numels = [block] * 8  # each tensor's reuse: twice the elements after it
    elements, tensors = regathered(numels, 0, tied=False)
    # 2 x 7/8, 2 x 6/8, 2 x 5/8 and 2 x 4/8 of the distance reach it; the last four are kept
    assert (elements, tensors) == (4 * block, 4)
    assert regathered(numels, block, tied=False) == (0, 0)  # at the threshold: persistent, never gathered


def test_a_tied_embedding_is_next_used_by_the_head_after_one_pass_over_the_blocks():
    block = 3 * MAX_REUSE_DISTANCE // 10
    numels = [1000, block, block, 10]  # 0.6 of the distance after the embedding: once under, twice over
    assert regathered(numels, 100, tied=True) == (0, 0)
    assert regathered(numels, 100, tied=False) == (1000, 1)


def test_zero3_on_two_ranks_gathers_a_small_model_once_a_micro_batch():
    config = compose_config("model=gpt2_124m", "parallel=zero3", "gpus=2", "batch.micro_size=1")
    plan = plan_config(config)
    dp = next(t for t in plan.traffic if t.group == "dp")
    assert "0% again in backward" in dp.detail
    assert regathered(param_numels(config.model), 10 * config.model.d_model, tied=True) == (0, 0)
