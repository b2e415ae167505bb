"""How a tensor-parallel checkpoint's tensors were split, complete for DeepSpeed's conversion.

``ds_to_universal`` (DeepSpeed 0.19.8) joins each tensor's tensor-parallel shards by the
record AutoTP leaves on the model (``UNIVERSAL_CHECKPOINT_INFO``: which tensors are split
by rows, by columns or by vocabulary, which are whole, as affine maps), saved in every
model-states file. Two layouts leave it incomplete, and runner/checkpoint/universal_conversion.py completes it
before each save:

- ZeRO-3 with tp: the tensors AutoTP leaves whole (the norms) are recorded with the shape
  ZeRO-3 has already partitioned away (:func:`record_whole_replicated_shapes`);
- tp x pp: each stage records its own tensors, and the conversion reads the first file's
  record only (:func:`record_every_stages_splits`, :func:`union_of_splits`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.distributed as dist
from deepspeed.checkpoint import UNIVERSAL_CHECKPOINT_INFO
from deepspeed.checkpoint.affine import replicated_map
from deepspeed.checkpoint.constants import AFFINE_MAP, AFFINE_MAP_PARAMS, TP_REPLICATED_PARAMETER_PATTERNS


def record_whole_replicated_shapes(module: torch.nn.Module, *, tp: int) -> None:
    """Describe each parameter AutoTP left whole (the norms) by its whole shape, not ZeRO-3's.

    DeepSpeed 0.19.8's AutoTP records such a parameter's map from ``param.shape``, which
    ZeRO-3 has already partitioned to nothing (``torch.Size([0])``); ``ds_to_universal`` then
    refuses its shards ("Rank 0 supplied a shard of 256 elements, but the map describes 0").
    ZeRO-3 keeps the whole shape as ``ds_shape``: the map is rebuilt from it, as AutoTP builds
    it for an unpartitioned model (``replicated_map``: one piece, held by every tp rank).
    """
    info = getattr(module, UNIVERSAL_CHECKPOINT_INFO)
    maps = info.get(AFFINE_MAP, {}).get(AFFINE_MAP_PARAMS, {})
    replicated = set(info.get(TP_REPLICATED_PARAMETER_PATTERNS, []))
    for name, param in module.named_parameters():
        pattern = rf"^{re.escape(name)}$"
        whole = getattr(param, "ds_shape", None)
        if whole is None or pattern not in replicated or pattern not in maps:
            continue
        if math.prod(maps[pattern]["logical_shape"]) == 0 < whole.numel():
            maps[pattern] = replicated_map(tuple(whole), tp).to_dict()


def record_every_stages_splits(module: torch.nn.Module) -> None:
    """Give every rank the splits of the whole model's tensors, each stage having recorded its own.

    ds_to_universal reads ``UNIVERSAL_CHECKPOINT_INFO`` from the first model-states file
    (the first stage's) only; without a stage's patterns its tensors would be joined along
    dimension 0, which is wrong for the row-split ``wo`` and ``w2`` and the whole norms.
    Collective: every rank calls it.
    """
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, getattr(module, UNIVERSAL_CHECKPOINT_INFO))
    merged: dict[str, Any] = {}
    for info in gathered:
        merged = union_of_splits(merged, info)
    setattr(module, UNIVERSAL_CHECKPOINT_INFO, merged)


def union_of_splits(a: Any, b: Any) -> Any:
    """Two stages' ``UNIVERSAL_CHECKPOINT_INFO`` as one: dicts by key, lists without repeats.

    A scalar (the format's version, the vocabulary's size) is the same in every stage.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        return {
            key: union_of_splits(a[key], b[key]) if key in a and key in b else a.get(key, b.get(key))
            for key in {**a, **b}
        }
    if isinstance(a, list) and isinstance(b, list):
        return a + [item for item in b if item not in a]
    if a != b:
        raise ValueError(f"the pipeline's stages record different universal-checkpoint values: {a!r}, {b!r}")
    return a
