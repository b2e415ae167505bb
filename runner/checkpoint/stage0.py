"""A ZeRO stage-0 checkpoint to and from DeepSpeed's universal format: ``parallel=ddp`` changes layout.

DeepSpeed 0.19.8 converts ZeRO 1-3 checkpoints only (``ds_to_universal`` reads their
optimizer partitions), and a stage-0 engine reads no universal checkpoint. At tp 1, pp 1,
stage 0 saves the whole model and torch's Adam state in one file, Adam's state numbered
by position in the optimizer's two groups (runner/engine/param_groups.py):

    fp32        optimizer: Adam's state_dict; the module holds the fp32 weights
    bf16, fp16  optimizer: {optimizer_state_dict: Adam's, fp32_groups: the fp32 master
                weights, loss-scale fields} (runtime/fp16/unfused_optimizer.py, stage 0's
                16-bit wrapper; ladder's torch AdamW keeps fp16 off the flat FP16_Optimizer)

:func:`to_universal` writes what ``ds_to_universal`` writes for a ZeRO-1 checkpoint at tp 1
(``zero/<name>/{fp32,exp_avg,exp_avg_sq}.pt`` as ``{"param", "cat_dim"}``, ``step.pt``,
``zero/optimizer_state.pt``, the model-states file without its optimizer), so every path
that loads a converted ZeRO checkpoint loads it. :func:`from_universal` writes, from any
universal checkpoint, the file a stage-0 engine at tp 1, pp 1 loads as its own. A
pipeline's stages: runner/checkpoint/stage0_pipeline.py, with the helpers here.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.checkpoint.constants import (
    CAT_DIM,
    DS_VERSION,
    OPTIMIZER_STATE_DICT,
    PARAM,
    PARAM_GROUPS,
    UNIVERSAL_CHECKPOINT_INFO,
)
from deepspeed.runtime.constants import FP16_LOSS_SCALE_WINDOW_DEFAULT
from deepspeed.runtime.fp16.loss_scaler import LOSS_SCALE_PROFILE_DEFAULTS, LossScaleProfile

from runner.config import ModelConfig, Precision
from runner.engine.fixes import pickle_in_checkpoints as safe_load
from runner.engine.param_groups import group_names, tied_names
from runner.model.transformer import build_model
from runner.parallel.tensor import ROW_PARALLEL

MODEL_STATES = "mp_rank_00_model_states.pt"
OPTIMIZER_STATE = "optimizer_state.pt"
ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


class ModelNames:
    """The model's parameter names in the optimizer's order, its tied names and every shape."""

    def __init__(self, model: ModelConfig) -> None:
        module = build_model(model, device="meta")  # shapes only
        self.groups = group_names(module)
        self.tied = tied_names(module)
        self.shapes = {name: param.shape for name, param in module.named_parameters()}
        self.state_dict_keys = list(module.state_dict().keys())  # tied names included
        self.in_order = [name for group in self.groups for name in group]


def stage0_parts(states: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor] | None]:
    """Adam's state_dict and the fp32 master weights (None: the module's weights are the masters)."""
    optimizer = states.get("optimizer")
    if not isinstance(optimizer, dict):
        raise ValueError("the stage-0 checkpoint holds no optimizer state")
    if "fp32_groups_flat" in optimizer:  # FP16_Optimizer (fp16): flat groups, not one tensor a parameter
        raise ValueError(
            "the stage-0 checkpoint was written in fp16, whose optimizer keeps flat groups; ladder "
            "moves fp32 and bf16 stage-0 checkpoints to another layout only"
        )
    if OPTIMIZER_STATE_DICT in optimizer:
        masters = [tensor for group in optimizer["fp32_groups"] for tensor in group]
        return optimizer[OPTIMIZER_STATE_DICT], masters
    return optimizer, None


def check_positions(
    adam: dict[str, Any], groups: list[list[str]], shapes: dict[str, torch.Size] | None
) -> None:
    """Adam's groups hold the parameters ``groups`` names, position by position (shapes compared,
    where ``shapes`` are given: a tensor-parallel shard's are checked once joined)."""
    sizes = [len(group["params"]) for group in adam["param_groups"]]
    expected = [len(group) for group in groups]
    if sizes != expected:
        raise ValueError(
            f"the checkpoint's optimizer groups hold {sizes} parameters, this model's {expected}: "
            f"was it written by another model?"
        )
    for index, name in enumerate(name for group in groups for name in group):
        state = adam["state"].get(index)
        if state is None:
            raise ValueError(f"the checkpoint holds no Adam state for {name} (position {index})")
        if shapes is not None and state["exp_avg"].shape != shapes[name]:
            raise ValueError(
                f"the checkpoint's Adam state at position {index} has shape {tuple(state['exp_avg'].shape)}, "
                f"this model's {name} {tuple(shapes[name])}: was it written by another model?"
            )


def _fragment(tensor: torch.Tensor) -> dict[str, Any]:

    return {PARAM: tensor.detach().float().clone(), CAT_DIM: 0}


def to_universal(source: Path, output: Path, model: ModelConfig, *, tp: int = 1) -> None:
    """Write the universal form of the stage-0 checkpoint in ``source`` (pp 1, ``tp`` ranks) into ``output``.

    Under tensor parallelism each rank's file holds its shards (runner/parallel/tensor.py's
    cut), joined here: row-parallel weights along their input features, the rest of the
    matrices along dimension 0, the norm gains whole on every rank.
    """
    ranks = [safe_load.load(source / f"mp_rank_{rank:02d}_model_states.pt") for rank in range(tp)]
    names = ModelNames(model)
    parts = [stage0_parts(states) for states in ranks]
    for adam, _ in parts:
        check_positions(adam, names.groups, names.shapes if tp == 1 else None)
    held = [
        dict(zip(names.in_order, masters, strict=True)) if masters is not None else states["module"]
        for states, (_, masters) in zip(ranks, parts, strict=True)
    ]
    weights, moments = {}, {}
    for index, name in enumerate(names.in_order):
        shape = names.shapes[name]
        weights[name] = join_tp_shards(name, [rank[name] for rank in held], shape)
        # An optimizer without moments (SGD without momentum) keeps no state: nothing to join.
        states = [adam["state"].get(index, {}) for adam, _ in parts]
        moments[name] = {
            key: join_tp_shards(name, [s[key] for s in states], shape)
            for key in ADAM_MOMENTS
            if key in states[0]
        }
        if "step" in states[0]:
            moments[name]["step"] = states[0]["step"]
    first = {**ranks[0], "mp_world_size": 1}  # one model-states file, as at tp 1
    write_universal(output, first, names, weights=weights, moments=moments, hyper=parts[0][0][PARAM_GROUPS])


def join_tp_shards(name: str, shards: list[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """Parameter ``name``'s whole tensor from its tensor-parallel shards, in rank order."""
    if len(shards) == 1 or shards[0].shape == shape:  # tp 1, or a norm gain every rank holds whole
        return shards[0]
    row_parallel = any(re.match(pattern, name) for pattern in ROW_PARALLEL)
    whole = torch.cat(shards, dim=1 if row_parallel else 0)
    if whole.shape != shape:
        raise ValueError(
            f"{name}: the {len(shards)} tensor-parallel shards join into {tuple(whole.shape)}, this model "
            f"holds {tuple(shape)}: was it written by another model?"
        )
    return whole


def write_universal(
    output: Path,
    states: dict[str, Any],
    names: ModelNames,
    *,
    weights: dict[str, torch.Tensor],
    moments: dict[str, dict[str, torch.Tensor]],
    hyper: list[dict[str, Any]],
) -> None:
    """Write what ``ds_to_universal`` writes for a ZeRO-1 checkpoint at tp 1: each parameter's fp32
    weight, Adam moments and step under the model's names, the optimizer's groups (``hyper``: their
    hyperparameters) and ``states``, the model-states file, without its optimizer."""
    zero = output / "zero"
    for name in names.in_order:
        folder = zero / name
        folder.mkdir(parents=True)
        torch.save(_fragment(weights[name]), folder / "fp32.pt")
        for key in ADAM_MOMENTS:
            if key in moments[name]:  # a stateless optimizer's checkpoint holds fp32 alone
                torch.save(_fragment(moments[name][key]), folder / f"{key}.pt")
        if "step" in moments[name]:
            torch.save(torch.as_tensor(moments[name]["step"]).detach().clone(), folder / "step.pt")
    for alias, owner in names.tied.items():  # as ds_to_universal: the weight, under its second name
        (zero / alias).mkdir()
        torch.save({PARAM: weights[owner].detach().float().clone()}, zero / alias / "fp32.pt")
    groups = [{**group, "params": [index]} for index, group in enumerate(hyper)]
    torch.save(
        {
            "dynamic_loss_scale": False,
            "overflow": False,
            "partition_count": [1] * len(groups),
            DS_VERSION: states.get(DS_VERSION, deepspeed.__version__),
            PARAM_GROUPS: groups,
        },
        zero / OPTIMIZER_STATE,
    )
    param_shapes = [OrderedDict((name, names.shapes[name]) for name in group) for group in names.groups]
    universal = {
        **states,
        "optimizer": None,
        "param_shapes": param_shapes,
        "shared_params": dict(names.tied),
        UNIVERSAL_CHECKPOINT_INFO: states.get(UNIVERSAL_CHECKPOINT_INFO) or {},
    }
    torch.save(universal, output / MODEL_STATES)


def whole_tensor(path: Path, shape: torch.Size, name: str) -> torch.Tensor:
    """One parameter's whole fp32 tensor from a universal file (ZeRO-3's conversion stores it flat)."""
    if not path.exists():
        raise ValueError(f"the universal checkpoint has no {path.parent.name}/{path.name}: another model?")
    fragment = safe_load.load(path)
    tensor = fragment[PARAM] if isinstance(fragment, dict) else fragment
    if tensor.numel() != math.prod(shape):
        raise ValueError(
            f"{name}: the universal checkpoint holds {tensor.numel()} elements, this model "
            f"{math.prod(shape)} {tuple(shape)}: was it written by another model?"
        )
    return tensor.detach().reshape(shape).float().clone()


def saved_groups(zero: Path) -> list[dict[str, Any]]:

    state = safe_load.load(zero / OPTIMIZER_STATE)
    groups: list[dict[str, Any]] = (
        state.get(OPTIMIZER_STATE_DICT, {}).get(PARAM_GROUPS) or state[PARAM_GROUPS]
    )
    return groups


def saved_tensor(zero: Path, name: str, key: str, names: ModelNames) -> torch.Tensor:
    """Parameter ``name``'s whole ``key`` (fp32, exp_avg or exp_avg_sq) from a universal ``zero`` folder."""
    return whole_tensor(zero / name / f"{key}.pt", names.shapes[name], name)


def read_adam(zero: Path, groups: list[list[str]], names: ModelNames) -> dict[str, Any]:
    """Adam's state_dict for ``groups`` of the model's parameters from a universal checkpoint's
    ``zero`` folder: each parameter's moments and step at its position, each group's hyperparameters."""
    hyper = saved_groups(zero)
    if len(hyper) != len(groups):
        raise ValueError(
            f"the universal checkpoint has {len(hyper)} optimizer groups, this model "
            f"{len(groups)}: was it written by another model?"
        )
    state: dict[int, dict[str, torch.Tensor]] = {}
    for index, name in enumerate(name for group in groups for name in group):
        step = safe_load.load(zero / name / "step.pt")
        state[index] = {
            "step": torch.as_tensor(step, dtype=torch.float32).clone(),
            **{key: saved_tensor(zero, name, key, names) for key in ADAM_MOMENTS},
        }
    param_groups, start = [], 0
    for group, saved in zip(groups, hyper, strict=True):
        values = {key: value for key, value in saved.items() if key != "params"}
        param_groups.append({**values, "params": list(range(start, start + len(group)))})
        start += len(group)
    return {"state": state, "param_groups": param_groups}


def unfused_state(
    adam: dict[str, Any], masters: list[list[torch.Tensor]], precision: Precision, *, cur_iter: int
) -> dict[str, Any]:
    """The optimizer state FP16_UnfusedOptimizer (stage 0 in bf16 and fp16) loads: Adam's, the
    fp32 masters by group and the loss scale's fields (runtime/fp16/unfused_optimizer.py
    ``load_state_dict``). In fp16 the scale starts as DeepSpeed's would; ladder then sets it
    to where the run left it (runner/engine/fixes/fp16_stage0_loss_scale.py ``restore_scaler``)."""
    scale: dict[str, Any] = {"dynamic_loss_scale": False, "cur_scale": 1.0, "cur_iter": cur_iter}
    if precision == Precision.fp16:
        defaults = LOSS_SCALE_PROFILE_DEFAULTS[LossScaleProfile.UNFUSED]
        scale = {
            "dynamic_loss_scale": True,
            "cur_scale": defaults.initial_dynamic_scale,
            "cur_iter": cur_iter,
            "last_overflow_iter": -1,
            "scale_factor": defaults.scale_factor,
            "scale_window": FP16_LOSS_SCALE_WINDOW_DEFAULT,
        }
    return {**scale, OPTIMIZER_STATE_DICT: adam, "fp32_groups": masters}


def from_universal(universal: Path, output: Path, model: ModelConfig, precision: Precision) -> None:
    """Write into ``output`` the stage-0, tp 1, pp 1 checkpoint of the universal one in ``universal``."""
    names = ModelNames(model)
    zero = universal / "zero"
    masters = {name: saved_tensor(zero, name, "fp32", names) for name in names.in_order}
    adam = read_adam(zero, names.groups, names)
    dtype = Precision(precision).torch_dtype
    module = OrderedDict((key, masters[names.tied.get(key, key)].to(dtype)) for key in names.state_dict_keys)
    states: dict[str, Any] = safe_load.load(universal / MODEL_STATES)
    optimizer: dict[str, Any] = adam
    if precision != Precision.fp32:
        by_group = [[masters[name] for name in group] for group in names.groups]
        optimizer = unfused_state(adam, by_group, precision, cur_iter=states.get("global_steps", 0))
    stage0 = {
        **states,
        "module": module,
        "optimizer": optimizer,
        "param_shapes": None,
        "shared_params": None,
        "dp_world_size": 1,
        "mp_world_size": 1,
    }
    output.mkdir(parents=True)
    torch.save(stage0, output / MODEL_STATES)
