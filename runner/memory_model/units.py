"""Byte sizes and units the memory estimator counts in, and its argument checks.

Convert for display with ``GB`` (1e9 bytes, the unit the ZeRO paper and the metric names
``memory/*_gb`` use) or ``GiB`` (2**30 bytes).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from runner.config import Precision

GB = 1e9  # decimal gigabyte: ZeRO's "120 GB", DESIGN.md's memory/*_gb metrics
GiB = 2**30  # binary gibibyte: what CUDA tools and device datasheets often mean by "GB"


FP32_BYTES = Precision.fp32.bytes  # IEEE single
HALF_BYTES = Precision.bf16.bytes  # bf16 / fp16
INT64_BYTES = 8  # token ids and targets
BOOL_BYTES = 1  # masks


_Member = TypeVar("_Member", bound=Enum)


def _choice(value: Any, kind: type[_Member], what: str) -> _Member:
    """The member of ``kind`` (one of runner.config's enums) for a member or its plain value."""
    text = getattr(value, "value", value)
    try:
        return kind(text)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in kind)
        raise ValueError(f"{what}={text!r} is not one of {allowed}") from None


def _shard(numel: int, bytes_per_elem: int, dp: int) -> int:
    """Bytes of one rank's partition of `numel` elements over `dp` ranks (ceil: the last may pad)."""
    return -(-numel // dp) * bytes_per_elem


def to_gb(num_bytes: float) -> float:
    """Bytes to decimal GB (1e9 bytes), the unit of the memory/*_gb metrics."""
    return num_bytes / GB


def to_gib(num_bytes: float) -> float:
    """Bytes to GiB (2**30 bytes)."""
    return num_bytes / GiB


def gb(num_bytes: float, digits: int = 1) -> str:
    """Bytes as decimal GB with the unit, for display: '61.2 GB' (``digits=2``: '61.23 GB')."""
    return f"{num_bytes / GB:.{digits}f} GB"


__all__ = [
    "BOOL_BYTES",
    "FP32_BYTES",
    "GB",
    "HALF_BYTES",
    "INT64_BYTES",
    "GiB",
    "gb",
    "to_gb",
    "to_gib",
]
