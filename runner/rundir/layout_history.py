"""The layouts one run trained on, in order: a resume onto another layout starts a new segment.

summary.json's ``layout_history`` lists each segment from the step it started at; a run
that never changed layout has one. A resume from step N keeps the segments that started
before N (steps after N, logged by an attempt that did not checkpoint them, are trained
again) and adds its own, unless it goes on in the layout the last one trained in (a
stopped or requeued run resumed as it was). A segment whose attempt converted the
checkpoint for its layout records the conversion: its seconds and the bytes it wrote.
"""

from __future__ import annotations

from typing import Any

from runner.layout import Layout
from runner.rundir.checkpoint_record import CheckpointRecord


def segment(
    *,
    from_step: int,
    parallel: str,
    zero_stage: int,
    precision: str,
    layout: Layout,
    conversion: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One segment: the step it starts at, the parallel config and the layout it trains on, and
    the conversion that moved the checkpoint onto it (``seconds``, ``bytes``), if one ran."""
    return {
        "from_step": from_step,
        "parallel": parallel,
        "zero_stage": zero_stage,
        "precision": precision,
        **layout.to_json(),
        **({"conversion": conversion} if conversion is not None else {}),
    }


def extended(
    earlier: list[dict[str, Any]] | None, record: CheckpointRecord | None, new: dict[str, Any]
) -> list[dict[str, Any]]:
    """The history after starting ``new``: from scratch (``record`` None) or from a checkpoint."""
    if record is None:
        return [new]
    kept = [seg for seg in earlier or [] if seg["from_step"] < new["from_step"]]
    if not kept:  # a run from before the history was kept: its checkpoint says where it trained
        kept = [{"from_step": 0, "zero_stage": record["zero_stage"], **record["layout"]}]
    if _same_layout(kept[-1], new):
        return kept
    return [*kept, new]


def _same_layout(earlier: dict[str, Any], new: dict[str, Any]) -> bool:
    def where(seg: dict[str, Any]) -> dict[str, Any]:
        # A segment from before sequence parallelism has no sp: it trained at sp 1.
        return {"sp": 1, **{k: v for k, v in seg.items() if k not in ("from_step", "conversion")}}

    return where(earlier) == where(new)


def _label(seg: dict[str, Any]) -> str:
    name = seg.get("parallel") or f"zero_stage {seg['zero_stage']}"
    split = " x ".join(
        f"{key} {seg[key]}" for key in ("dp", "tp", "pp", "sp") if key == "dp" or seg.get(key, 1) > 1
    )
    return f"{name} on {seg['gpus']} ({split})"


def _moved(seg: dict[str, Any]) -> str:
    converted = seg.get("conversion")
    if not converted:
        return ""
    return f" (converted in {converted['seconds']:.1f} s, {converted['bytes'] / 1e6:,.1f} MB)"


def describe(history: list[dict[str, Any]] | None) -> str | None:
    """One line for a run that changed layout, e.g. ``ddp on 2 (dp 2) from step 0, zero3 on 1 ...``."""
    if not history or len(history) < 2:
        return None
    return "layouts: " + " -> ".join(
        f"{_label(seg)} from step {seg['from_step']}{_moved(seg)}" for seg in history
    )
