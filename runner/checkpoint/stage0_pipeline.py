"""A pipeline's stage-0 checkpoint to and from the universal format: ``parallel=ddp`` with ``pp`` > 1.

DeepSpeed's PipelineEngine saves each stage apart: the weights of its layers in
``layer_XX-model_states.pt`` (XX the layer's index in runner/parallel/pipeline.py's list; a tied
output head has no file of its own) and its optimizer in ``mp_rank_<stage>_model_states.pt``.
Under tensor parallelism each model-parallel rank ``stage * tp + tp_rank`` writes its
shards: ``layer_XX-model_<tp rank>-model_states.pt`` and ``mp_rank_<stage * tp + tp rank>``.
The optimizer, by precision:

    fp32  torch's Adam state, numbered by position in the stage's two groups
          (runner/engine/param_groups.py), which hold the stage's parameters in the plain model's
          order: a tied embedding first (DeepSpeed's ``tied_modules``), then layer by layer
    fp16  the same inside FP16_UnfusedOptimizer's state, beside the fp32 masters by group
    bf16  BF16_Optimizer (DeepSpeed's stage-0 bf16 optimizer under a pipeline): each group's
          fp32 masters and Adam moments flat, cut over the data-parallel ranks
          (``bf16_zero_pp_rank_<d>_mp_rank_<mp rank>_optim_states.pt``), each parameter's piece
          found by its pipeline name (``param_slice_mappings``)

:func:`to_universal` joins the stages under runner/model/transformer.py's names (a tied embedding from
the first stage; the last holds the same values) and writes what runner/checkpoint/stage0.py
writes for the one file of a stage-0 checkpoint without a pipeline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT

from runner.checkpoint.stage0 import (
    ADAM_MOMENTS,
    MODEL_STATES,
    ModelNames,
    check_positions,
    join_tp_shards,
    read_adam,
    saved_tensor,
    stage0_parts,
    unfused_state,
    write_universal,
)
from runner.config import ModelConfig, Precision
from runner.engine.fixes import pickle_in_checkpoints as safe_load
from runner.parallel.pipeline_names import model_name, pipeline_name
from runner.parallel.pipeline_split import stage_bounds

Moments = dict[str, dict[str, torch.Tensor]]
# DeepSpeed's layer files: layer_XX-model_states.pt; under tensor parallelism, by tp rank TT,
# layer_XX-model_TT-model_states.pt
LAYER_FILE = re.compile(r"layer_(?P<layer>\d+)(?:-model_(?P<tp_rank>\d+))?-model_states\.pt")


def stage_groups(names: ModelNames, model: ModelConfig, *, pp: int, stage: int) -> list[list[str]]:
    """Each optimizer group's parameters on ``stage`` of ``pp``, by model name, in the stage's order."""
    start, stop = stage_bounds(model.n_layer, pp)[stage]

    def on_stage(name: str) -> bool:
        layer = pipeline_name(model, name).partition(".")[0]
        if layer == "tied_modules":  # the lookup on the first stage, the output head on the last
            return stage in (0, pp - 1)
        return start <= int(layer) < stop

    return [[name for name in group if on_stage(name)] for group in names.groups]


def _layer_files(source: Path, *, tp_rank: int, tp: int) -> list[tuple[int, Path]]:
    """Each layer file of tensor-parallel rank ``tp_rank`` with its layer index.

    DeepSpeed names them ``layer_XX-model_states.pt`` at tp 1 and
    ``layer_XX-model_<tp rank>-model_states.pt`` under tensor parallelism (``ckpt_layer_path``).
    """
    files = []
    for path in source.glob("layer_*-model_states.pt"):
        found = LAYER_FILE.fullmatch(path.name)
        if found and int(found["tp_rank"] or 0) == tp_rank and (found["tp_rank"] is None) == (tp == 1):
            files.append((int(found["layer"]), path))
    return sorted(files)


def _layer_weights(
    source: Path, model: ModelConfig, *, tp_rank: int = 0, tp: int = 1
) -> dict[str, torch.Tensor]:
    """Every layer file's weights of tensor-parallel rank ``tp_rank``, by model name (its shards)."""
    weights: dict[str, torch.Tensor] = {}
    for layer, path in _layer_files(source, tp_rank=tp_rank, tp=tp):
        for key, tensor in safe_load.load(path).items():
            weights.setdefault(model_name(model, f"{layer}.{key}"), tensor)
    return weights


def _bf16_stage(
    source: Path, mp_rank: int, model: ModelConfig, shapes: dict[str, torch.Size]
) -> tuple[dict[str, torch.Tensor], Moments, list[dict[str, Any]]]:
    """One model-parallel rank's fp32 masters, Adam moments and group hyperparameters, joined over
    its dp ranks; ``shapes``: the shapes this rank holds (its shards, under tensor parallelism)."""
    pattern = f"bf16_zero_pp_rank_*_mp_rank_{mp_rank:02d}_optim_states.pt"
    files = sorted(source.glob(pattern), key=lambda path: int(path.name.split("_")[4]))
    if not files:
        raise ValueError(f"model-parallel rank {mp_rank} left no {pattern}")
    parts = [safe_load.load(path)[OPTIMIZER_STATE_DICT] for path in files]
    weights: dict[str, torch.Tensor] = {}
    moments: Moments = {}
    for group in range(len(parts[0]["single_partition_of_fp32_groups"])):
        step = parts[0]["base_optimizer_state"]["state"].get(group, {}).get("step")
        pieces: dict[str, list[tuple[int, dict[str, torch.Tensor]]]] = {}
        for dp_rank, part in enumerate(parts):
            adam = part["base_optimizer_state"]["state"].get(group, {})  # empty: SGD without momentum
            flat = {"fp32": part["single_partition_of_fp32_groups"][group]}
            flat.update({key: adam[key] for key in ADAM_MOMENTS if key in adam})
            size = flat["fp32"].numel()
            for name, address in part["param_slice_mappings"][group].items():
                span = slice(address.start, address.start + address.numel)
                piece = {key: tensor[span] for key, tensor in flat.items()}
                pieces.setdefault(model_name(model, name), []).append((dp_rank * size + address.start, piece))
        for name, found in pieces.items():
            found.sort(key=lambda item: item[0])
            whole = {key: torch.cat([piece[key] for _, piece in found]) for key in found[0][1]}
            if whole["fp32"].numel() != shapes[name].numel():
                raise ValueError(
                    f"model-parallel rank {mp_rank} holds {whole['fp32'].numel()} elements of {name}, "
                    f"its shard {tuple(shapes[name])}: was it written by another model?"
                )
            weights[name] = whole.pop("fp32").reshape(shapes[name])
            moments[name] = {key: value.reshape(shapes[name]) for key, value in whole.items()}
            if step is not None:
                moments[name]["step"] = step
    return weights, moments, parts[0]["base_optimizer_state"]["param_groups"]


class RankState(NamedTuple):
    """What one model-parallel rank saved, by model name; under tensor parallelism its shards."""

    states: dict[str, Any]  # its model-states file
    weights: dict[str, torch.Tensor]  # fp32
    moments: Moments  # Adam's, with its step
    hyper: list[dict[str, Any]]  # the optimizer groups' hyperparameters


@dataclass(frozen=True)
class _Saved:
    """The checkpoint being read: its folder, the model it holds by name, and its pp x tp grid."""

    source: Path
    model: ModelConfig
    names: ModelNames
    pp: int
    tp: int


def _rank_state(saved: _Saved, held: dict[str, torch.Tensor], *, stage: int, tp_rank: int) -> RankState:
    """What model-parallel rank (``stage``, ``tp_rank``) saved; ``held``: the weights in its
    tensor-parallel rank's layer files (16-bit in bf16 and fp16), by model name."""
    source, model, names, pp, tp = saved.source, saved.model, saved.names, saved.pp, saved.tp
    mp_rank = stage * tp + tp_rank  # the grid's axes are (pipe, data, model): runner/parallel/pipeline.py
    states: dict[str, Any] = safe_load.load(source / f"mp_rank_{mp_rank:02d}_model_states.pt")
    optimizer = states.get("optimizer")
    if not isinstance(optimizer, dict):
        raise ValueError(f"stage {stage}, tp rank {tp_rank}: its checkpoint holds no optimizer state")
    if "param_slice_mappings" in optimizer:  # bf16: BF16_Optimizer
        shapes = {name: tensor.shape for name, tensor in held.items()}
        return RankState(states, *_bf16_stage(source, mp_rank, model, shapes))
    # torch's Adam by position in the stage's groups; in fp16 beside the fp32 masters
    adam, masters = stage0_parts(states)
    groups = stage_groups(names, model, pp=pp, stage=stage)
    check_positions(adam, groups, names.shapes if tp == 1 else None)  # shards: checked once joined
    in_order = [name for group in groups for name in group]
    moments = {name: adam["state"][index] for index, name in enumerate(in_order)}
    weights = held if masters is None else dict(zip(in_order, masters, strict=True))  # fp32: the layers'
    return RankState(states, weights, moments, adam["param_groups"])


def to_universal(source: Path, output: Path, model: ModelConfig, *, pp: int, tp: int = 1) -> None:
    """Write into ``output`` the universal form of the stage-0 checkpoint in ``source`` (pp stages of
    tp ranks).

    Model-parallel rank ``stage * tp + tp_rank`` wrote each stage's shards (DeepSpeed's
    ``mp_rank_XX`` files, the layer files by tp rank), joined here as
    runner/checkpoint/stage0.py joins a tensor-parallel checkpoint's: row-parallel weights
    along their input features, the rest along dimension 0, the norm gains whole.
    """
    names = ModelNames(model)
    weights: dict[str, torch.Tensor] = {}
    moments: Moments = {}
    first: dict[str, Any] = {}
    hyper: list[dict[str, Any]] = []
    held = [_layer_weights(source, model, tp_rank=tp_rank, tp=tp) for tp_rank in range(tp)]  # each file once
    saved = _Saved(source, model, names, pp=pp, tp=tp)
    for stage in range(pp):
        ranks = [_rank_state(saved, held[tp_rank], stage=stage, tp_rank=tp_rank) for tp_rank in range(tp)]
        on_stage = [name for group in stage_groups(names, model, pp=pp, stage=stage) for name in group]
        for name in on_stage:
            if name in moments:  # a tied embedding: from the first stage (the last holds the same)
                continue
            if not all(name in rank.weights and name in rank.moments for rank in ranks):
                continue  # reported below, with every name missing
            shape = names.shapes[name]
            weights[name] = join_tp_shards(name, [rank.weights[name] for rank in ranks], shape)
            adam = [rank.moments[name] for rank in ranks]
            moments[name] = {
                key: join_tp_shards(name, [a[key] for a in adam], shape)
                for key in ADAM_MOMENTS
                if key in adam[0]
            }
            if "step" in adam[0]:
                moments[name]["step"] = adam[0]["step"]
        if stage == 0:  # one model-states file, as a checkpoint of one model-parallel rank
            first, hyper = {**ranks[0].states, "mp_world_size": 1}, ranks[0].hyper
    missing = [name for name in names.in_order if name not in moments]
    if missing:
        raise ValueError(f"the checkpoint's {pp} stages hold no state for {', '.join(missing[:3])}")
    write_universal(output, first, names, weights=weights, moments=moments, hyper=hyper)


def _layer_key(model: ModelConfig, name: str) -> tuple[int, str]:
    """The layer file and key of the model's parameter ``name``."""
    layer, _, key = pipeline_name(model, name).partition(".")
    if layer == "tied_modules":
        return 0, key.partition(".")[2]  # tied_modules.embed.weight: the lookup's file, layer 0
    return int(layer), key


def from_universal(
    universal: Path, output: Path, model: ModelConfig, *, pp: int, precision: Precision = Precision.fp32
) -> None:
    """Write into ``output`` the fp32 or fp16 stage-0 checkpoint of ``pp`` stages (tp 1) of the universal one
    (under tensor parallelism each rank slices the universal one itself: runner/checkpoint/stage0_tp.py).

    Each stage's ``mp_rank_<stage>_model_states.pt`` holds its Adam state by position in its
    groups (in fp16 inside FP16_UnfusedOptimizer's state, beside the fp32 masters); the
    ``layer_XX`` files hold the weights in the parameters' dtype, as DeepSpeed's
    PipelineEngine loads them. (bf16's BF16_Optimizer reads the universal checkpoint itself.)
    """
    names = ModelNames(model)
    zero = universal / "zero"
    states: dict[str, Any] = safe_load.load(universal / MODEL_STATES)
    output.mkdir(parents=True)
    masters = {name: saved_tensor(zero, name, "fp32", names) for name in names.in_order}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name in names.in_order:
        layer, key = _layer_key(model, name)
        layers.setdefault(layer, {})[key] = masters[name].to(Precision(precision).torch_dtype)
    for layer, weights in sorted(layers.items()):
        torch.save(weights, output / f"layer_{layer:02d}-model_states.pt")
    for stage in range(pp):
        groups = stage_groups(names, model, pp=pp, stage=stage)
        adam = read_adam(zero, groups, names)
        optimizer = adam
        if precision != Precision.fp32:
            by_group = [[masters[name] for name in group] for group in groups]
            optimizer = unfused_state(adam, by_group, precision, cur_iter=states.get("global_steps", 0))
        stage_states = {
            **states,
            "module": None,
            "optimizer": optimizer,
            "param_shapes": None,
            "shared_params": None,
            "dp_world_size": 1,
            "mp_world_size": pp,
        }
        torch.save(stage_states, output / f"mp_rank_{stage:02d}_model_states.pt")


__all__ = ["from_universal", "stage_groups", "to_universal"]
