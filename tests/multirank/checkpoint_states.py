"""Read a checkpoint's tensors back (weights-only), to compare the states two checkpoints hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from runner.engine.fixes import pickle_in_checkpoints as safe_load


def _tensors(obj: Any, prefix: str) -> dict[str, torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return {prefix: obj.detach()}
    items: list[tuple[Any, Any]] = []
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    found: dict[str, torch.Tensor] = {}
    for key, value in items:
        found.update(_tensors(value, f"{prefix}/{key}"))
    return found


def checkpoint_tensors(run_dir: Path, tag: str) -> dict[str, torch.Tensor]:
    """Every tensor of DeepSpeed's files in ``checkpoints/<tag>``: weights, optimizer state, Adam's step."""
    found: dict[str, torch.Tensor] = {}
    for path in sorted((run_dir / "checkpoints" / tag).glob("*.pt")):
        if not path.name.startswith("rng_"):
            found.update(_tensors(safe_load.load(path), path.name))
    return found


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest elementwise difference between two checkpoints' tensors (same names)."""
    assert a.keys() == b.keys()
    return max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()), default=0.0)
