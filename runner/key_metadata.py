"""What each config key means and which values it takes: the metadata of a schema's fields.

Every field of runner/config.py's schemas carries :func:`about`'s dict: its meaning in one line
and, for a number, its valid :class:`Range`. runner/preflight/schema_keys.py reads both back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What each key means and which values it takes, kept in its field beside its default so that
# neither can drift: ``python train.py --help`` prints the meaning (launchers/help.py), and
# runner/preflight/validate.py refuses a value outside the range before any rank starts.
HELP = "help"
RANGE = "range"


@dataclass(frozen=True)
class Range:
    """A numeric key's valid values: a lower and an upper bound, each included unless open."""

    low: float | None = None  # None: unbounded
    high: float | None = None
    low_open: bool = False  # True: ``low`` itself is out of range
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in the range."""
        above_low = self.low is None or value > self.low or (value == self.low and not self.low_open)
        below_high = self.high is None or value < self.high or (value == self.high and not self.high_open)
        return above_low and below_high

    def words(self) -> str:
        """The range as a refusal says it: ``at least 1``, ``positive``, ``in (0, 1]``."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None and self.low_open:
            return "positive" if self.low == 0 else f"above {self.low:g}"
        if self.low is not None:
            return "0 or more" if self.low == 0 else f"at least {self.low:g}"
        if self.high is not None:
            return f"below {self.high:g}" if self.high_open else f"at most {self.high:g}"
        return "any number"


def about(
    meaning: str,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
) -> dict[str, Any]:
    """A key's field metadata: its meaning in one line, and (for a number) its valid range."""
    valid = None
    if (at_least, above, at_most, below) != (None, None, None, None):
        low = above if above is not None else at_least
        high = below if below is not None else at_most
        valid = Range(low, high, low_open=above is not None, high_open=below is not None)
    return {HELP: meaning, RANGE: valid}
