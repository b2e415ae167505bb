"""A ZeRO stage-0 checkpoint to and from DeepSpeed's universal format: ``parallel=ddp`` changes layout.

DeepSpeed 0.19.8 converts ZeRO 1-3 checkpoints only (``ds_to_universal`` reads their
optimizer partitions), and a stage-0 engine reads no universal checkpoint. At tp 1, pp 1,
stage 0 saves the whole model and torch's Adam state in one file, Adam's state numbered
by position in the optimizer's two groups (runner/param_groups.py):

    fp32  optimizer: Adam's state_dict; the module holds the fp32 weights
    bf16  optimizer: {optimizer_state_dict: Adam's, fp32_groups: the fp32 master weights,
          loss-scale fields} (runtime/fp16/unfused_optimizer.py, stage 0's bf16 wrapper)

:func:`to_universal` writes what ``ds_to_universal`` writes for a ZeRO-1 checkpoint at tp 1
(``zero/<name>/{fp32,exp_avg,exp_avg_sq}.pt`` as ``{"param", "cat_dim"}``, ``step.pt``,
``zero/optimizer_state.pt``, the model-states file without its optimizer), so every path
that loads a converted ZeRO checkpoint loads it. :func:`from_universal` writes, from any
universal checkpoint, the file a stage-0 engine at tp 1, pp 1 loads as its own.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from runner import safe_load
from runner.config import ModelConfig, Precision
from runner.param_groups import group_names, tied_names

MODEL_STATES = "mp_rank_00_model_states.pt"
OPTIMIZER_STATE = "optimizer_state.pt"
_MOMENTS = ("exp_avg", "exp_avg_sq")


class _ModelNames:
    """The model's parameter names in the optimizer's order, its tied names and every shape."""

    def __init__(self, model: ModelConfig) -> None:
        from runner.model import build_model

        module = build_model(model, device="meta")  # shapes only
        self.groups = group_names(module)
        self.tied = tied_names(module)
        self.shapes = {name: param.shape for name, param in module.named_parameters()}
        self.state_dict_keys = list(module.state_dict().keys())  # tied names included
        self.in_order = [name for group in self.groups for name in group]


def _stage0_parts(states: dict[str, Any]) -> tuple[dict[str, Any], list[torch.Tensor] | None]:
    """Adam's state_dict and the fp32 master weights (None: the module's weights are the masters)."""
    from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT

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


def _check_positions(adam: dict[str, Any], names: _ModelNames) -> None:
    """Adam's groups hold this model's parameters, position by position (shapes compared)."""
    sizes = [len(group["params"]) for group in adam["param_groups"]]
    expected = [len(group) for group in names.groups]
    if sizes != expected:
        raise ValueError(
            f"the checkpoint's optimizer groups hold {sizes} parameters, this model's {expected}: "
            f"was it written by another model?"
        )
    for index, name in enumerate(names.in_order):
        state = adam["state"].get(index)
        if state is None:
            raise ValueError(f"the checkpoint holds no Adam state for {name} (position {index})")
        if state["exp_avg"].shape != names.shapes[name]:
            raise ValueError(
                f"the checkpoint's Adam state at position {index} has shape {tuple(state['exp_avg'].shape)}, "
                f"this model's {name} {tuple(names.shapes[name])}: was it written by another model?"
            )


def _fragment(tensor: torch.Tensor) -> dict[str, Any]:
    from deepspeed.checkpoint.constants import CAT_DIM, PARAM

    return {PARAM: tensor.detach().float().clone(), CAT_DIM: 0}


def to_universal(source: Path, output: Path, model: ModelConfig) -> None:
    """Write the universal form of the stage-0, tp 1, pp 1 checkpoint in ``source`` into ``output``."""
    import deepspeed
    from deepspeed.checkpoint.constants import DS_VERSION, PARAM, PARAM_GROUPS, UNIVERSAL_CHECKPOINT_INFO

    states: dict[str, Any] = safe_load.load(source / MODEL_STATES)
    names = _ModelNames(model)
    adam, masters = _stage0_parts(states)
    _check_positions(adam, names)
    weights = dict(zip(names.in_order, masters, strict=True)) if masters is not None else states["module"]
    zero = output / "zero"
    for index, name in enumerate(names.in_order):
        folder = zero / name
        folder.mkdir(parents=True)
        state = adam["state"][index]
        torch.save(_fragment(weights[name]), folder / "fp32.pt")
        for key in _MOMENTS:
            torch.save(_fragment(state[key]), folder / f"{key}.pt")
        torch.save(state["step"].detach().clone(), folder / "step.pt")
    for alias, owner in names.tied.items():  # as ds_to_universal: the weight, under its second name
        (zero / alias).mkdir()
        torch.save({PARAM: weights[owner].detach().float().clone()}, zero / alias / "fp32.pt")
    groups = [{**group, "params": [index]} for index, group in enumerate(adam[PARAM_GROUPS])]
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


def _whole(path: Path, shape: torch.Size, name: str) -> torch.Tensor:
    """One parameter's whole fp32 tensor from a universal file (ZeRO-3's conversion stores it flat)."""
    from deepspeed.checkpoint.constants import PARAM

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


def _saved_groups(zero: Path) -> list[dict[str, Any]]:
    from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT, PARAM_GROUPS

    state = safe_load.load(zero / OPTIMIZER_STATE)
    groups: list[dict[str, Any]] = (
        state.get(OPTIMIZER_STATE_DICT, {}).get(PARAM_GROUPS) or state[PARAM_GROUPS]
    )
    return groups


def from_universal(universal: Path, output: Path, model: ModelConfig, precision: Precision) -> None:
    """Write into ``output`` the stage-0, tp 1, pp 1 checkpoint of the universal one in ``universal``."""
    from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT

    if precision == Precision.fp16:
        raise ValueError("parallel=ddp in fp16 keeps flat optimizer groups; ladder does not write them")
    names = _ModelNames(model)
    zero = universal / "zero"
    saved_groups = _saved_groups(zero)
    if len(saved_groups) != len(names.groups):
        raise ValueError(
            f"the universal checkpoint has {len(saved_groups)} optimizer groups, this model "
            f"{len(names.groups)}: was it written by another model?"
        )
    masters: dict[str, torch.Tensor] = {}
    adam_state: dict[int, dict[str, torch.Tensor]] = {}
    for index, name in enumerate(names.in_order):
        shape = names.shapes[name]
        masters[name] = _whole(zero / name / "fp32.pt", shape, name)
        step = safe_load.load(zero / name / "step.pt")
        adam_state[index] = {
            "step": torch.as_tensor(step, dtype=torch.float32).clone(),
            **{key: _whole(zero / name / f"{key}.pt", shape, name) for key in _MOMENTS},
        }
    groups, start = [], 0
    for group, saved in zip(names.groups, saved_groups, strict=True):
        hyper = {key: value for key, value in saved.items() if key != "params"}
        groups.append({**hyper, "params": list(range(start, start + len(group)))})
        start += len(group)
    adam = {"state": adam_state, "param_groups": groups}
    dtype = torch.bfloat16 if precision == Precision.bf16 else torch.float32
    module = OrderedDict((key, masters[names.tied.get(key, key)].to(dtype)) for key in names.state_dict_keys)
    states: dict[str, Any] = safe_load.load(universal / MODEL_STATES)
    optimizer: dict[str, Any] = adam
    if precision == Precision.bf16:
        optimizer = {
            "dynamic_loss_scale": False,
            "cur_scale": 1.0,
            "cur_iter": states.get("global_steps", 0),
            OPTIMIZER_STATE_DICT: adam,
            "fp32_groups": [[masters[name] for name in group] for group in names.groups],
        }
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
