"""The step's hooks called as one (runner/train/step_hooks.py): every hook at every seam, in order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from runner.train.step_hooks import StepHookChain, StepHooks

pytestmark = pytest.mark.unit


class Recorder(StepHooks):
    """Writes each seam it is called at into ``calls``; skips the update at ``skip_at``."""

    def __init__(self, name: str, calls: list[str], *, skip_at: int | None = None, scale: float = 1.0):
        self.name, self.calls, self.skip_at, self.scale = name, calls, skip_at, scale

    def before_step(self, step: int) -> None:
        self.calls.append(f"{self.name} before_step {step}")

    @contextlib.contextmanager
    def forward(self, step: int, micro: int) -> Iterator[None]:
        self.calls.append(f"{self.name} enter {micro}")
        yield
        self.calls.append(f"{self.name} exit {micro}")

    def loss(self, step: int, micro: int, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def before_update(self, step: int, loss: float) -> bool:
        self.calls.append(f"{self.name} before_update {loss}")
        return step == self.skip_at


def test_each_hook_is_called_in_order_and_the_loss_passes_through_each():
    calls: list[str] = []
    chain = StepHookChain([Recorder("a", calls, scale=2.0), Recorder("b", calls, scale=3.0)])
    chain.before_step(4)
    with chain.forward(4, 0):
        calls.append("forward")
    assert float(chain.loss(4, 0, torch.tensor(1.5))) == 9.0
    chain.after_backward(4, 0)  # the defaults do nothing
    chain.after_step(4)
    assert calls == [
        "a before_step 4",
        "b before_step 4",
        "a enter 0",
        "b enter 0",
        "forward",
        "b exit 0",
        "a exit 0",
    ]


def test_the_update_is_skipped_when_any_hook_says_so_and_every_hook_still_sees_the_boundary():
    calls: list[str] = []
    chain = StepHookChain([Recorder("a", calls, skip_at=2), Recorder("b", calls)])
    assert chain.before_update(2, 0.5) is True
    assert chain.before_update(3, 0.25) is False
    assert calls == [f"{name} before_update {loss}" for loss in (0.5, 0.25) for name in "ab"]
