"""``ds_to_universal`` converts a checkpoint whose optimizer keeps no moments (SGD without momentum).

DeepSpeed 0.19.8's deepspeed/checkpoint/ds_to_universal.py assumes Adam: ``extract_zero_shards``
(ZeRO 1/2) and ``extract_zero_shards_stage3`` read ``state[i]["exp_avg"]`` and
``state[i]["exp_avg_sq"]`` unconditionally, and ``merge_tp_slices`` / ``merge_zero3_slices`` merge
``("fp32", "exp_avg", "exp_avg_sq")`` for every parameter. A stateless optimizer's ``state`` is
empty, so the conversion dies with ``KeyError: 0`` (ZeRO-3), or (ZeRO 1/2, which counts groups
by ``len(state)``) writes no fragment at all. :func:`install` replaces the two extractions with
ones that write the states the optimizer holds (``fp32`` always; ``exp_avg``, ``exp_avg_sq``,
``step`` where present), and has the merges stop after ``fp32`` for a parameter whose moments
were never written. Adam's checkpoints convert exactly as before.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable
from typing import Any

import torch

MOMENTS = ("exp_avg", "exp_avg_sq")


class _Absent(Exception):
    """A state no fragment was written for: the optimizer does not keep it."""


def _present(state: dict[Any, Any], group: int, fp32: Any) -> dict[str, Any]:
    """The flat states of one group: fp32, and the moments and step the optimizer keeps."""
    kept = state.get(group, {})
    flat = {"fp32": fp32}
    flat.update({key: kept[key] for key in (*MOMENTS, "step") if key in kept})
    return flat


def install() -> None:
    """Patch ``deepspeed.checkpoint.ds_to_universal`` for this process (its workers fork after)."""
    # Deferred: only a conversion to the universal format imports ds_to_universal.
    from deepspeed.checkpoint import ds_to_universal as ds

    if getattr(ds, "_stateless_installed", False):
        return
    ds._stateless_installed = True
    ds.extract_zero_shards = _extract_zero_shards(ds)
    ds.extract_zero_shards_stage3 = _extract_zero_shards_stage3(ds)
    merge = ds._merge_zero_shards

    def merge_zero_shards(param_base_path: str, state: str, tp_degree: int, slice_shapes: Any = None) -> Any:
        """DeepSpeed's merge; a moment with no fragment at any tp rank is absent, not an error."""
        if state in MOMENTS and not any(
            glob.glob(os.path.join(param_base_path, str(tp), f"{state}.*")) for tp in range(tp_degree)
        ):
            raise _Absent(state)
        return merge(param_base_path, state, tp_degree, slice_shapes)

    ds._merge_zero_shards = merge_zero_shards
    ds.merge_tp_slices = _stopping_at_absent(ds.merge_tp_slices, [])
    ds.merge_zero3_slices = _stopping_at_absent(ds.merge_zero3_slices, None)


def _stopping_at_absent(merge: Callable[..., Any], otherwise: Any) -> Callable[..., Any]:
    """``merge``, ending quietly at the first absent moment (``fp32``, merged first, is written)."""

    def merged(*args: Any) -> Any:
        """One parameter's merge."""
        try:
            return merge(*args)
        except _Absent:
            return otherwise

    return merged


def _extract_zero_shards(ds: Any) -> Callable[..., None]:
    """ZeRO 1/2's extraction (ds_to_universal ``extract_zero_shards``), counting groups by fp32."""

    def extract_zero_shards(dir: str, ds_checkpoint: Any, indices_3D: Any) -> None:
        """Dump each parameter's fragment of every state the optimizer holds."""
        pp_index, tp_index, dp_index = indices_3D
        sd = ds_checkpoint.get_zero_checkpoint_state(pp_index=pp_index, tp_index=tp_index, dp_index=dp_index)
        optim_sd = sd[ds.OPTIMIZER_STATE_DICT]
        param_slice_mappings = optim_sd[ds.PARAM_SLICE_MAPPINGS]
        info = ds_checkpoint.get_checkpoint_info(ds.UNIVERSAL_CHECKPOINT_INFO)
        replicated = info.get(ds.PIPELINE_REPLICATED_PARAMETER_PATTERNS, [])
        state_groups = optim_sd[ds.BASE_OPTIMIZER_STATE]["state"]
        fp32_groups = optim_sd[ds.SINGLE_PARTITION_OF_FP32_GROUPS]
        for group, fp32 in enumerate(fp32_groups):
            flat = _present(state_groups, group, fp32)
            for name, mapping in param_slice_mappings[group].items():
                if pp_index > 0 and any(re.match(pattern, name) for pattern in replicated):
                    continue  # tied weights replicated in the first and last pipeline stages
                for key, tensor in flat.items():
                    ds.dump_param_fragment(
                        dir, tp_index, dp_index, key, tensor, name, mapping.start, mapping.numel
                    )

    return extract_zero_shards


def _extract_zero_shards_stage3(ds: Any) -> Callable[..., None]:
    """ZeRO-3's extraction (ds_to_universal ``extract_zero_shards_stage3``), moments where kept."""

    def extract_zero_shards_stage3(
        optim_files_grid: Any,
        param_shapes_grid: Any,
        dp_degree: int,
        temp_dir: str,
        indices: Any,
        exclude_param_names: Any = None,
    ) -> None:
        """Dump each parameter's fragment of every state the optimizer holds."""
        tp_index, dp_index = indices
        excluded = exclude_param_names or set()
        state_dict = torch.load(optim_files_grid[tp_index][dp_index], map_location="cpu", weights_only=False)
        optim_sd = state_dict[ds.OPTIMIZER_STATE_DICT]
        partition_groups = optim_sd.get("ds_zero_partition_groups") or []
        state = optim_sd["optimizer_state_dict"]["state"]
        for idx, sub_group_shape in enumerate(param_shapes_grid[tp_index]):
            flat = _present(state, idx, optim_sd["fp32_flat_groups"][idx])
            flat.pop("step", None)  # DeepSpeed's stage-3 extraction writes no step either
            metadata = partition_groups[idx] if idx < len(partition_groups) else {}
            count = metadata.get("partition_count", dp_degree)
            rank = metadata.get("partition_rank", dp_index)
            offset = 0
            for name, shape in sub_group_shape.items():
                numel = ds._shape_numel(shape)
                partitioned, _ = ds._zero_partitioned_param_info(numel, count)
                padding_free = max(0, min(partitioned, numel - rank * partitioned))
                if name not in excluded:
                    for key, tensor in flat.items():
                        ds.dump_param_fragment(
                            temp_dir, tp_index, dp_index, key, tensor, name, offset, padding_free
                        )
                offset += partitioned

    return extract_zero_shards_stage3
