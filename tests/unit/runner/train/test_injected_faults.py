"""The faults tests inject into a run's steps (runner/train/injected_faults.py)."""

from __future__ import annotations

import pytest
import torch

from runner.train.injected_faults import InjectedFaults, rank_steps

pytestmark = pytest.mark.unit


def test_a_spec_names_a_rank_and_its_steps():
    assert rank_steps("1:2,5", 1) == {2, 5}
    assert rank_steps("1:2,5", 0) == set()
    assert rank_steps("", 1) == set()


def test_the_faults_land_on_the_rank_and_steps_named():
    faults = InjectedFaults(1, {"LADDER_INJECT_NAN": "1:2", "LADDER_INJECT_FAULT": "1:3"})
    loss = torch.tensor(2.5)
    assert torch.isnan(faults.loss(2, 0, loss)) and faults.loss(1, 0, loss) is loss
    faults.before_step(2)
    with pytest.raises(RuntimeError, match="fault injected by LADDER_INJECT_FAULT on rank 1 at step 3"):
        faults.before_step(3)
    other = InjectedFaults(0, {"LADDER_INJECT_NAN": "1:2", "LADDER_INJECT_FAULT": "1:3"})
    other.before_step(3)
    assert other.loss(2, 0, loss) is loss
