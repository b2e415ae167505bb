"""The errors a refused run raises before any rank starts; each message names the key, the value
and the fix (STYLE.md principle 4). ``LayoutError`` (the batch contract) is runner/layout.py's."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration the runner refuses; the message lists every problem found."""
