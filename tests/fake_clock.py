"""A clock that moves only when a test says: the unit tests of runner/metrics' timers read it in place
of ``time.perf_counter`` or ``time.time``, so the intervals they measure are exact on any host."""

from __future__ import annotations


class FakeClock:
    """Call it for the time now; ``sleep`` moves it on."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
