"""The exposed-communication timer: blocking calls and waits on async handles count, launches do not."""

from __future__ import annotations

import time

import pytest

from runner.metrics.comm_timer import CollectiveTimer

pytestmark = pytest.mark.unit


class _Handle:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def wait(self) -> bool:
        time.sleep(self.seconds)
        return True

    def is_completed(self) -> bool:
        return False


class _Backend:
    """Stands in for a communication backend: a collective that blocks, one that returns a handle."""

    def all_reduce(self, tensor: list[int], async_op: bool = False) -> _Handle | None:
        if async_op:
            return _Handle(0.05)
        time.sleep(0.05)
        return None

    def get_rank(self) -> int:
        return 0


def test_blocking_calls_and_waits_count_and_unwrapping_restores_the_backend() -> None:
    backend = _Backend()
    timer = CollectiveTimer().install(backend)
    backend.all_reduce([1])
    blocked = timer.seconds
    handle = backend.all_reduce([1], async_op=True)
    launched = timer.seconds - blocked
    assert handle is not None and handle.wait() is True and handle.is_completed() is False
    seconds = timer.take()
    assert launched < 0.04  # the launch did not block
    assert 0.09 <= seconds < 0.5  # the blocking call and the wait did
    assert timer.calls == 2 and timer.take() == 0.0
    backend.get_rank()  # not a collective: not wrapped, not counted
    assert timer.seconds == 0.0
    timer.remove()
    assert backend.all_reduce([1], async_op=True).__class__ is _Handle
