"""The optimizer's two parameter groups, and the parameter names in the order it holds them.

Decay matrices and embeddings, not norm gains (nanoGPT's rule: decay params with dim >= 2).
A stage-0 checkpoint numbers Adam's state by position in these groups, so converting one
to or from DeepSpeed's universal format (runner/checkpoint/stage0.py) names each position
with :func:`group_names`, the same rule on the same model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch


def _decays(shape: Sequence[int]) -> bool:
    return len(shape) >= 2


def _split(named: Iterable[tuple[str, torch.nn.Parameter]]) -> tuple[list[Any], list[Any]]:
    decay: list[Any] = []
    no_decay: list[Any] = []
    for name, param in named:
        if param.requires_grad:
            # A ZeRO-3 parameter built by zero.Init holds an empty tensor: its shape is ds_shape.
            shape = getattr(param, "ds_shape", param.shape)
            (decay if _decays(shape) else no_decay).append((name, param))
    return decay, no_decay


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The groups DeepSpeed builds the optimizer from: decayed first, then the rest (weight decay 0)."""
    decay, no_decay = _split(model.named_parameters())  # a tied weight once, by its first name
    return [
        {"params": [param for _, param in decay], "weight_decay": weight_decay},
        {"params": [param for _, param in no_decay], "weight_decay": 0.0},
    ]


def group_names(model: torch.nn.Module) -> list[list[str]]:
    """Each group's parameter names, in the optimizer's order (the order of :func:`param_groups`)."""
    return [[name for name, _ in group] for group in _split(model.named_parameters())]


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """Each second name of a tied parameter, with the name the optimizer knows it by."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(param), name)
        if owner != name:
            tied[name] = owner
    return tied
