"""The batch contract: the global batch is the experiment, the layout only splits it.

    global_size = micro_size * accum_steps * dp,    dp = gpus / (tp * pp * sp)

``global_size`` (sequences per optimizer step) is held fixed whatever the layout;
``accum_steps`` is always derived; ``micro_size`` is given or chosen (``auto``: the
largest divisor of ``global_size / dp`` that fits the device, leaving at least two
micro-batches per step when dp is 1). A layout that cannot
hold the global batch is refused with the arithmetic and the nearest values that work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass


class LayoutError(ValueError):
    """A layout that cannot hold the global batch; the message carries the arithmetic."""


@dataclass(frozen=True)
class Layout:
    """How one optimizer step's global batch is split over ranks and micro-batches."""

    gpus: int
    dp: int
    tp: int
    pp: int
    micro_size: int
    accum_steps: int
    global_size: int
    sp: int = 1  # ranks that split each sample's sequence (parallel.sp)

    @property
    def model_parallel(self) -> int:
        """Ranks that share each sample: tp x pp x sp (gpus / dp)."""
        return self.tp * self.pp * self.sp

    @property
    def zero_ranks(self) -> int:
        """Ranks that reduce gradients together and that ZeRO partitions over: dp x sp (DeepSpeed's
        sequence-data group; dp where sp is 1)."""
        return self.dp * self.sp

    def split_words(self) -> str:
        """The contract in numbers: ``gpus 8 = dp 2 x tp 2 x pp 2; global 64 = micro 4 x accum 8 x dp 2``
        (`` x sp N`` after pp where sequence parallelism splits each sample)."""
        shared = f"tp {self.tp} x pp {self.pp}" + (f" x sp {self.sp}" if self.sp != 1 else "")
        return (
            f"gpus {self.gpus} = dp {self.dp} x {shared}; global {self.global_size} = "
            f"micro {self.micro_size} x accum {self.accum_steps} x dp {self.dp}"
        )

    def to_json(self) -> dict[str, int]:
        """The layout record other parts read (summary.json, reports)."""
        return asdict(self)


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0] if n > 0 else []
    return small + [n // d for d in reversed(small) if d * d != n]


def _fmt(values: list[int]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def workable_gpus(*, global_size: int, tp: int, pp: int, near: int, count: int = 6, sp: int = 1) -> list[int]:
    """The ``count`` gpu counts nearest ``near`` whose dp divides ``global_size``."""
    model_parallel = tp * pp * sp
    candidates = [model_parallel * dp for dp in divisors(global_size)]
    return sorted(sorted(candidates, key=lambda g: (abs(g - near), g))[:count])


def data_parallel_size(*, gpus: int, tp: int, pp: int, sp: int = 1) -> int:
    """dp = gpus / (tp * pp * sp); refuses gpus that the model-parallel degrees do not divide."""
    if gpus < 1:
        raise LayoutError(f"gpus={gpus}: the number of ranks must be at least 1; set gpus=1 or more")
    if tp < 1 or pp < 1 or sp < 1:
        named = f"parallel.tp={tp}, parallel.pp={pp}" + (f", parallel.sp={sp}" if sp != 1 else "")
        raise LayoutError(f"{named}: degrees must be at least 1; use 1 to switch one off")
    shared = tp * pp * sp
    if gpus % shared != 0:
        multiples = [shared * k for k in range(1, 5)]
        if sp == 1:
            product, formula = f"tp x pp = {tp} x {pp} = {shared}", "gpus / (tp x pp)"
        else:
            product, formula = f"tp x pp x sp = {tp} x {pp} x {sp} = {shared}", "gpus / (tp x pp x sp)"
        raise LayoutError(
            f"gpus={gpus} is not a multiple of {product}: dp = {formula} must be whole; "
            f"try gpus in {_fmt(multiples)}"
        )
    return gpus // shared


# 1F1B idles (pp - 1) / m of the ideal step for m micro-batches (Narayanan et al. 2021,
# arXiv 2104.04473, Sec. 2.2.1), small only when m >> pp: with m >= 4 pp it stays under 1/4.
PIPELINE_MICRO_BATCHES_PER_STAGE = 4


def most_pipeline_micro(per_rank: int, pp: int) -> int:
    """The largest micro-batch ``auto`` takes under a pipeline: one that leaves at least
    ``PIPELINE_MICRO_BATCHES_PER_STAGE`` x pp micro-batches per step where the batch has
    them, else 1 (as many micro-batches as it has)."""
    return max(1, per_rank // (PIPELINE_MICRO_BATCHES_PER_STAGE * pp))


def resolve_layout(
    *,
    gpus: int,
    tp: int,
    pp: int,
    global_size: int,
    micro_size: int | None,
    fits: Callable[[int], bool] | None = None,
    sp: int = 1,
) -> Layout:
    """Derive dp and accum_steps from the contract; ``micro_size=None`` chooses it.

    With ``micro_size=None`` the largest divisor of ``global_size / dp`` for which
    ``fits(micro)`` holds is taken (every divisor when ``fits`` is None), below
    ``global_size`` itself when dp is 1, and under a pipeline no larger than
    ``most_pipeline_micro``.
    """
    if global_size < 1:
        raise LayoutError(f"batch.global_size={global_size}: sequences per optimizer step must be at least 1")
    dp = data_parallel_size(gpus=gpus, tp=tp, pp=pp, sp=sp)
    if global_size % dp != 0:
        split = f"gpus {gpus} / (tp {tp} x pp {pp}" + (f" x sp {sp})" if sp != 1 else ")")
        workable = workable_gpus(global_size=global_size, tp=tp, pp=pp, near=gpus, sp=sp)
        raise LayoutError(
            f"batch.global_size={global_size} cannot be split over dp={dp} ranks "
            f"({split}): {global_size} / {dp} is not whole; try gpus in {_fmt(workable)}"
        )
    per_rank = global_size // dp
    if micro_size is None:
        # On one data-parallel rank, auto keeps at least two micro-batches per step: the
        # noise scale needs two gradients per step (runner/metrics/noise_scale.py), at the cost of
        # one more, smaller forward. Largest first, stopping at the first that fits: fits()
        # may cost a memory plan.
        candidates = divisors(per_rank)
        if dp == 1 and per_rank > 1:
            candidates = candidates[:-1]
        if pp > 1:
            candidates = [m for m in candidates if m <= most_pipeline_micro(per_rank, pp)]
        chosen = next((m for m in reversed(candidates) if fits is None or fits(m)), None)
        if chosen is None:
            raise LayoutError(
                f"batch.micro_size=auto: not even micro_size 1 fits the device memory at "
                f"dp={dp}; run with plan=true to see each memory term, then shard more "
                f"(a higher ZeRO stage), turn on model.activation_checkpointing, or add gpus"
            )
        micro_size = chosen
    if micro_size < 1:
        raise LayoutError(f"batch.micro_size={micro_size}: must be at least 1, or auto")
    if per_rank % micro_size != 0:
        if global_size % micro_size == 0:
            other_gpus = workable_gpus(global_size=global_size // micro_size, tp=tp, pp=pp, near=gpus, sp=sp)
            gpus_hint = f", or gpus in {_fmt(other_gpus)}"
        else:
            gpus_hint = f" (micro {micro_size} does not divide global {global_size} at any gpus)"
        raise LayoutError(
            f"batch.micro_size={micro_size} cannot hold batch.global_size={global_size}: "
            f"global {global_size} != micro {micro_size} x accum {per_rank / micro_size:.3g} "
            f"x dp {dp}, and accum must be whole; try batch.micro_size in "
            f"{_fmt(divisors(per_rank))} or auto{gpus_hint}"
        )
    return Layout(
        gpus=gpus,
        dp=dp,
        tp=tp,
        pp=pp,
        micro_size=micro_size,
        accum_steps=per_rank // micro_size,
        global_size=global_size,
        sp=sp,
    )


def parse_micro_size(value: str) -> int | None:
    """``auto`` -> None, a positive integer string -> int; anything else is refused."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise LayoutError(
            f"batch.micro_size={value!r}: expected a positive integer or 'auto'; e.g. batch.micro_size=4"
        ) from None
