"""``planner.max_seq=true``: the longest sequence the run's layout fits, in each recompute mode.

Activations are the term the sequence drives: the blocks' grow with s (and attention's scores
with s^2 on a path without a fused kernel), the loss's with s x vocabulary unless it runs in
pieces (``model.loss_tiles``). For the layout the plan resolved (its ZeRO stage, tp, pp, offload,
micro-batch and accumulation), :func:`longest_sequences` finds for each recompute mode the
largest ``data.seq_len`` whose planned peak per device (runner/memory_model/peak.py) is within
``planner.headroom`` of the device memory, by bisection: the peak grows with s. The RoPE tables
are taken as long as the sequence (``model.max_seq_len`` raised where it is shorter).
"""

from __future__ import annotations

import dataclasses

from runner.config import Recompute
from runner.layout import Layout
from runner.plan.micro_fit import memory_at
from runner.step_time.workload import Knobs, Workload

LIMIT = 2**26  # 67M tokens: past any sequence a device of today holds


def _fits(workload: Workload, knobs: Knobs, layout: Layout, seq_len: int) -> bool:
    model = workload.model
    at = dataclasses.replace(
        workload,
        seq_len=seq_len,
        model=dataclasses.replace(model, max_seq_len=max(model.max_seq_len, seq_len)),
    )
    memory = memory_at(at, knobs, micro_size=layout.micro_size, dp=layout.dp, accum_steps=layout.accum_steps)
    return memory.peak <= workload.usable_bytes


def longest_sequence(workload: Workload, knobs: Knobs, layout: Layout) -> int | None:
    """The largest sequence length (at most :data:`LIMIT`) this layout fits; None: not even 2 tokens.
    Under sequence parallelism the lengths tried are multiples of sp, which must divide them."""
    unit = knobs.spec.sp

    def fits(pieces: int) -> bool:
        return _fits(workload, knobs, layout, pieces * unit)

    most = LIMIT // unit
    low = 2 if unit == 1 else 1
    if not fits(low):
        return None
    high = low
    while high < most and fits(min(2 * high, most)):
        high = min(2 * high, most)
    if high == most:
        return most * unit
    low, high = high, min(2 * high, most)  # fits at low, not at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low * unit


def recompute_modes(workload: Workload) -> tuple[Recompute, ...]:
    """The modes tried: op-level selective only where the blocks run eagerly (runner/rules/recompute.py)."""
    return tuple(mode for mode in Recompute if not (workload.compiled and mode == Recompute.selective))


def _with_recompute(knobs: Knobs, mode: Recompute) -> Knobs:
    """The same knobs in recompute mode ``mode``."""
    return dataclasses.replace(knobs, spec=dataclasses.replace(knobs.spec, recompute=mode))


def longest_sequences(workload: Workload, knobs: Knobs, layout: Layout) -> dict[str, int | None]:
    """:func:`longest_sequence` in each recompute mode, the layout otherwise as planned."""
    return {
        mode.value: longest_sequence(workload, _with_recompute(knobs, mode), layout)
        for mode in recompute_modes(workload)
    }


def max_seq_lines(
    workload: Workload, knobs: Knobs, layout: Layout, longest: dict[str, int | None]
) -> list[str]:
    """plan=true's lines: the layout, then each mode's longest sequence."""
    sp = f", sp {layout.sp}" if layout.sp != 1 else ""
    where = (
        f"{knobs.parallel}, tp {layout.tp}, pp {layout.pp}{sp}, micro {layout.micro_size}, {layout.gpus} gpus"
    )
    lines = [f"longest sequence that fits ({where}; planner.max_seq=true):"]
    for mode, tokens in longest.items():
        words = "not even 2 tokens" if tokens is None else f"{tokens:,} tokens"
        if tokens == LIMIT:
            words = f"{LIMIT:,} tokens or more"
        lines.append(f"  model.activation_checkpointing={mode}: {words}")
    return lines


__all__ = ["LIMIT", "longest_sequence", "longest_sequences", "max_seq_lines", "recompute_modes"]
