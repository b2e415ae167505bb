"""The exposed-communication timer: blocking calls and waits on async handles count, launches do not.

The stand-in backend advances a fake clock instead of sleeping, so the counted seconds are exact
however busy the host is.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fake_clock import FakeClock

from runner.metrics import comm_timer
from runner.metrics.comm_timer import CollectiveTimer

pytestmark = pytest.mark.unit


class _Handle:
    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def wait(self) -> bool:
        self.clock.now += self.seconds
        return True

    def is_completed(self) -> bool:
        return False


class _Backend:
    """Stands in for a communication backend: a collective that blocks, one that returns a handle."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def all_reduce(self, tensor: list[int], async_op: bool = False) -> _Handle | None:
        if async_op:
            return _Handle(self.clock, 0.05)
        self.clock.now += 0.05
        return None

    def get_rank(self) -> int:
        return 0


@pytest.fixture
def backend(monkeypatch) -> _Backend:
    clock = FakeClock(now=0.0)
    monkeypatch.setattr(comm_timer, "time", SimpleNamespace(perf_counter=clock))
    return _Backend(clock)


def test_blocking_calls_and_waits_count_and_unwrapping_restores_the_backend(backend) -> None:
    timer = CollectiveTimer().install(backend)
    backend.all_reduce([1])
    blocked = timer.seconds
    handle = backend.all_reduce([1], async_op=True)
    launched = timer.seconds - blocked
    assert handle is not None and handle.wait() is True and handle.is_completed() is False
    seconds = timer.take()
    assert launched == 0.0  # the launch did not block
    assert seconds == pytest.approx(0.10)  # the blocking call and the wait did
    assert timer.calls == 2 and timer.take() == 0.0
    backend.get_rank()  # not a collective: not wrapped, not counted
    assert timer.seconds == 0.0
    timer.remove()
    assert backend.all_reduce([1], async_op=True).__class__ is _Handle
