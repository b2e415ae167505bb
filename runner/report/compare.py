"""Is it still the same experiment? Loss curves across cells, and what differs between their configs.

With the global batch held fixed (DESIGN.md, the batch contract), changing the layout changes
only the order of floating-point reductions, so cells of one model and one global batch
should log the same loss at every step up to rounding. The check: at each step that at least
two cells logged, the spread max - min of their losses, against a tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.report.collect import Cell

# Default tolerances on |loss difference| (nats). fp32: reduction-order differences are ~1e-6
# per step (two ddp/zero2 cells of the tiny model differ by 5e-7 after 8 steps) and grow slowly.
# 16-bit: bf16 keeps 8 significant bits (relative rounding 2^-8 = 0.4 %), so per-step losses of
# ~3 nats differ by ~1e-2 and drift further; 5e-2 separates that from a real difference.
TOLERANCE_FP32 = 1e-3
TOLERANCE_16BIT = 5e-2
EVAL_LOSS = "eval/loss"  # the held-out loss, logged at evaluations only (runner/train/evaluation.py)


@dataclass(frozen=True)
class LossAgreement:
    """How far apart the loss curves of one group of cells (same model, same global batch) are."""

    model: str | None
    global_size: int | None
    cell_ids: list[str]
    steps: list[int]  # steps that at least two cells logged
    spread: list[float]  # max - min loss across the cells at each of those steps
    tolerance: float
    tolerance_source: str
    metric: str = "loss"  # or "eval/loss": the held-out loss (runner/train/evaluation.py)
    held_out: str = ""  # for eval/loss: what the group's cells evaluated on

    @property
    def label(self) -> str:
        """What is compared, e.g. ``loss curves`` or ``held-out loss curves``."""
        return "held-out loss curves" if self.metric == EVAL_LOSS else "loss curves"

    @property
    def max_spread(self) -> float | None:
        """The largest spread over all compared steps, or None when no step had two cells."""
        return max(self.spread) if self.spread else None

    @property
    def worst_step(self) -> int | None:
        """The step of the largest spread."""
        return self.steps[self.spread.index(max(self.spread))] if self.spread else None

    @property
    def coincide(self) -> bool | None:
        """True when every compared step is within tolerance; None when there is nothing to compare."""
        return None if self.max_spread is None else self.max_spread <= self.tolerance

    def verdict(self) -> str:
        """One sentence saying whether the curves coincide, with the numbers."""
        group = f"model {self.model or '?'}, global batch {self.global_size or '?'}"
        group += f", held out: {self.held_out}" if self.held_out else ""
        if self.max_spread is None:
            return f"{group}: fewer than two cells logged a common step; nothing to compare"
        word = "coincide" if self.coincide else "DIFFER"
        return (
            f"{group}: the {self.label} of {len(self.cell_ids)} cells {word}: max |Δloss| "
            f"{self.max_spread:.2e} at step {(self.worst_step or 0) + 1} over {len(self.steps)} common steps "
            f"(tolerance {self.tolerance:.0e}, {self.tolerance_source})"
        )


def _default_tolerance(cells: Sequence[Cell]) -> tuple[float, str]:
    precisions = {str(c.summary.precision or c.config_value("precision.name") or "") for c in cells}
    if precisions <= {"fp32", ""}:
        return TOLERANCE_FP32, "default for fp32"
    return TOLERANCE_16BIT, "default when a cell trains in 16-bit"


def _held_out(cell: Cell) -> str:
    """What a cell's held-out loss was measured on: its batches and tokens (they must match)."""
    batches = cell.config_value("train.eval_batches")
    source = cell.config_value("data.val_path") or "built-in"
    return f"{batches} batches of {source}"


def loss_agreement(
    cells: Sequence[Cell], *, tolerance: float | None = None, metric: str = "loss"
) -> list[LossAgreement]:
    """One agreement per (model, global batch) group of cells that logged ``metric``; for the
    held-out ``eval/loss``, per group that also evaluated the same batches of the same tokens."""
    groups: dict[tuple[str | None, int | None, str], list[Cell]] = {}
    for cell in cells:
        if not cell.loss_curve(metric):
            continue
        layout = cell.summary.layout or {}
        global_size = layout.get("global_size", cell.config_value("batch.global_size"))
        model = cell.summary.model or cell.config_value("model.name")
        key = (
            str(model) if model is not None else None,
            global_size if isinstance(global_size, int) else None,
            _held_out(cell) if metric == EVAL_LOSS else "",
        )
        groups.setdefault(key, []).append(cell)
    out = []
    for (model, global_size, held_out), members in groups.items():
        curves = [c.loss_curve(metric) for c in members]
        all_steps = sorted(set().union(*curves))
        steps, spread = [], []
        for step in all_steps:
            losses = [curve[step] for curve in curves if step in curve]
            if len(losses) >= 2:
                steps.append(step)
                spread.append(max(losses) - min(losses))
        tol, source = (tolerance, "given") if tolerance is not None else _default_tolerance(members)
        out.append(
            LossAgreement(
                model=model,
                global_size=global_size,
                cell_ids=[c.cell_id for c in members],
                steps=steps,
                spread=spread,
                tolerance=tol,
                tolerance_source=source,
                metric=metric,
                held_out=held_out,
            )
        )
    return out


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): node}


@dataclass(frozen=True)
class ConfigDiff:
    """The composed-config keys whose values differ between cells, and how many agree."""

    cell_ids: list[str]  # cells with a composed config, in report order
    differing: dict[str, dict[str, Any]]  # key -> cell id -> value (absent key: missing)
    same: int  # keys with one value across all cells
    without_config: list[str]  # cells whose .hydra/config.yaml is absent


def config_diff(cells: Sequence[Cell]) -> ConfigDiff:
    """What differs between the cells' composed configs (.hydra/config.yaml), key by dotted key."""
    with_config = [c for c in cells if c.config]
    flat = {c.cell_id: _flatten(c.config) for c in with_config}
    keys = sorted(set().union(*flat.values())) if flat else []
    differing: dict[str, dict[str, Any]] = {}
    same = 0
    for key in keys:
        values = {cid: f[key] for cid, f in flat.items() if key in f}
        distinct = {repr(v) for v in values.values()}
        if len(distinct) > 1 or len(values) < len(flat):
            differing[key] = values
        else:
            same += 1
    return ConfigDiff(
        cell_ids=[c.cell_id for c in with_config],
        differing=differing,
        same=same,
        without_config=[c.cell_id for c in cells if not c.config],
    )
