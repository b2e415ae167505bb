"""Step hooks a run adds through LADDER_STEP_HOOKS (runner/train/setup.py ``extra_step_hooks``), and
the faults the tests inject with them (tests/step_faults.py)."""

from __future__ import annotations

import pytest
import torch
from train_helpers import ROOT, injecting

from runner.train.setup import extra_step_hooks

pytestmark = pytest.mark.unit


def test_without_the_variable_a_run_adds_no_hooks():
    assert extra_step_hooks(0, {}) == []


def test_the_test_faults_land_on_the_rank_and_steps_named(monkeypatch):
    environ = injecting(LADDER_INJECT_NAN="1:2,5", LADDER_INJECT_FAULT="1:3")
    for name, value in environ.items():  # what a rank inherits
        monkeypatch.setenv(name, value)
    [faults] = extra_step_hooks(1, environ)
    loss = torch.tensor(2.5)
    assert [bool(torch.isnan(faults.loss(step, 0, loss))) for step in range(6)] == [0, 0, 1, 0, 0, 1]
    faults.before_step(2)
    with pytest.raises(RuntimeError, match="fault injected by LADDER_INJECT_FAULT on rank 1 at step 3"):
        faults.before_step(3)
    [other_rank] = extra_step_hooks(0, environ)
    other_rank.before_step(3)
    assert other_rank.loss(2, 0, loss) is loss


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("tests/step_faults.py", "expected <file.py>:<name>"),
        (f"{ROOT}/tests/no_such_file.py:hooks", "no file"),
        (f"{ROOT}/tests/step_faults.py:no_such_name", "defines no callable no_such_name"),
    ],
)
def test_a_spec_that_names_no_hooks_is_refused_with_what_it_lacks(spec, error):
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        extra_step_hooks(0, {"LADDER_STEP_HOOKS": spec})
