"""Refuse a sweep whose cells would train with different global batches, before anything launches.

``batch.global_size`` is the experiment: a sweep over layouts, seeds or learning rates
compares like with like only while every cell steps on the same number of sequences.
A sweep that changes it (``-m batch.global_size=16,32``) is refused unless
``batch.allow_varying=true`` says it is on purpose.

The cells are enumerated the way Hydra's BasicSweeper enumerates them (its override
parser, then its cartesian product), and each cell's global batch is its own
``batch.global_size=`` (or ``batch={global_size: ...}``) override, else the composed
default. Not detected, because that would need composing every cell: a config group
option (an ``experiment=``-style ``# @package _global_`` file) that sets the batch, an
interpolation that resolves differently per cell (``batch.global_size='${gpus}'`` with
``gpus`` swept: compared as the same text), and the search spaces of other sweepers
(Optuna, Ax...), which the callback does not check at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override

BATCH_KEY = "batch.global_size"
ALLOW_KEY = "batch.allow_varying"
FIX = (
    f"set {ALLOW_KEY}=true to sweep the batch on purpose "
    "(then consider optimizer.lr_scaling=linear|sqrt with optimizer.reference_batch)"
)


def sweep_cells(task_overrides: Sequence[str], *, config_loader: Any = None) -> list[list[str]]:
    """The sweep's cells, one override list per job, in the order Hydra's BasicSweeper launches them."""
    # config_loader lets glob(...) list a config group's options; plain choices and ranges need none.
    parser = OverridesParser.create(config_loader=config_loader)
    overrides = parser.parse_overrides(list(task_overrides))
    (cells,) = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    return cells


def _cell_value(overrides: Sequence[Override], key: str, default: Any) -> Any:
    """The value a cell's overrides give ``key`` (the last one wins, as in Hydra), else ``default``."""
    group, _, leaf = key.rpartition(".")
    value = default
    for override in overrides:
        if override.package is not None or override.is_delete():
            continue
        if override.key_or_group == key:
            value = override.value()
        elif override.key_or_group == group:  # batch={global_size: 32, ...}
            whole = override.value()
            if isinstance(whole, dict) and leaf in whole:
                value = whole[leaf]
    return value


def _as_batch(value: Any) -> int | str:
    """An int batch as an int; anything else (an interpolation, a typo) as its text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return str(value)


def cell_global_batches(
    task_overrides: Sequence[str], default: int, *, config_loader: Any = None
) -> list[tuple[str, int | str]]:
    """Each cell's global batch, with the cell's other swept overrides that tell it apart (may be "")."""
    parser = OverridesParser.create()
    cells = [
        parser.parse_overrides(cell) for cell in sweep_cells(task_overrides, config_loader=config_loader)
    ]
    # Keys whose override differs between cells: the rest are the same in every cell.
    seen: dict[str, set[str]] = {}
    for cell in cells:
        for override in cell:
            seen.setdefault(override.get_key_element(), set()).add(override.input_line or "")
    varying = {key for key, lines in seen.items() if len(lines) > 1}
    result: list[tuple[str, int | str]] = []
    for cell in cells:
        others = " ".join(
            o.input_line or ""
            for o in cell
            if o.get_key_element() in varying and o.key_or_group not in (BATCH_KEY, "batch")
        )
        result.append((others, _as_batch(_cell_value(cell, BATCH_KEY, default))))
    return result


def refusal(
    task_overrides: Sequence[str], *, default: int, allow_varying: bool, config_loader: Any = None
) -> str | None:
    """The refusal message when the cells' global batches differ and that is not allowed, else None."""
    cells = cell_global_batches(task_overrides, default, config_loader=config_loader)
    if len({batch for _, batch in cells}) <= 1:
        return None
    # allow_varying may itself be an override (even a swept one): every cell must allow it.
    parser = OverridesParser.create()
    allowed = [
        _cell_value(parser.parse_overrides(cell), ALLOW_KEY, allow_varying) is True
        for cell in sweep_cells(task_overrides, config_loader=config_loader)
    ]
    if all(allowed):
        return None
    lines = [
        "ladder: refused before launch:",
        f"  the sweep's {len(cells)} cells would train with different global batches "
        f"({BATCH_KEY} is the experiment; a sweep holds it fixed):",
    ]
    for index, (others, batch) in enumerate(cells):
        lines.append(f"  cell {index}: {BATCH_KEY}={batch}" + (f"  ({others})" if others else ""))
    lines.append(f"  {FIX}")
    return "\n".join(lines)
