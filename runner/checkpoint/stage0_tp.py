"""A universal checkpoint into a stage-0 engine cut by tensor parallelism: ``parallel=ddp parallel.tp=N``.

DeepSpeed's stage-0 engine reads no universal checkpoint, and each rank's shards follow
AutoTP's cut (uneven where its grain says so), which only the cut module knows. So the rank
loads it itself once DeepSpeed has restored the LR schedule and the client state from the
universal model-states file (it loads no module from a universal checkpoint and, asked
not to, no optimizer): each parameter's whole fp32 weight and Adam moments from
``zero/<name>/``, sliced for this rank by the partition AutoTP recorded on the parameter
(DeepSpeed's ``_resolve_autotp_partition``, which ZeRO's universal loading slices by too).
Under a pipeline too (tp x pp): each stage's ranks read the universal checkpoint through the
pipeline's view of it, under the stage's own parameter names (runner/checkpoint/universal_conversion.py).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from deepspeed.checkpoint.constants import PARAM
from deepspeed.checkpoint.universal_checkpoint import _get_param_uc_restore_meta, _resolve_autotp_partition
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
from deepspeed.utils import groups

from runner.checkpoint.stage0 import ADAM_MOMENTS, saved_groups
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.engine.fixes import pickle_in_checkpoints as safe_load


def _shard(param: torch.nn.Parameter, path: Path, key: str, *, rank: int, tp: int) -> torch.Tensor:
    """This rank's slice of the whole tensor in ``path``, shaped as ``param``."""
    saved = safe_load.load(path)
    whole: torch.Tensor = saved[PARAM] if isinstance(saved, dict) else saved
    if whole.numel() == param.numel():  # held whole on every rank of the group (a norm gain)
        return whole.reshape(param.shape).float()
    meta = _get_param_uc_restore_meta(param) or {}
    logical = meta.get("logical_shape")
    if logical is None or math.prod(logical) != whole.numel():
        raise ValueError(
            f"{path.parent.name}: the universal checkpoint holds {whole.numel()} elements, this "
            f"rank's shard {tuple(param.shape)} of tp {tp} has no AutoTP record that matches"
        )
    piece = _resolve_autotp_partition(param, {PARAM: whole}, whole.reshape(logical), rank, tp, state_key=key)
    if piece is None or piece.numel() != param.numel():
        raise ValueError(f"{path.parent.name}: AutoTP's record gives no slice of it for tp rank {rank}")
    return piece.reshape(param.shape).float()


@contextlib.contextmanager
def engine_loading(engine: DeepSpeedEngine) -> Iterator[None]:
    """While DeepSpeed's engine loads the universal checkpoint's model-states file.

    The engine ends a universal load with ``optimizer.update_lp_params()`` (engine.py
    ``load_checkpoint``), which stage 0's optimizers lack; :func:`load` copies the weights itself.
    """
    optimizer = engine.optimizer
    stub = not hasattr(optimizer, "update_lp_params")
    if stub:
        optimizer.update_lp_params = lambda: None
    try:
        yield
    finally:
        if stub:
            del optimizer.update_lp_params


def load(engine: DeepSpeedEngine, folder: Path, *, tp: int) -> None:
    """Load the universal checkpoint in ``folder`` into this rank's weights and Adam state."""
    optimizer = engine.optimizer
    if isinstance(optimizer, FP16_UnfusedOptimizer):  # bf16: fp32 masters beside the 16-bit weights
        pairs = [
            (weight, master)
            for weights, masters in zip(optimizer.fp16_groups, optimizer.fp32_groups, strict=True)
            for weight, master in zip(weights, masters, strict=True)
        ]
        adam = optimizer.optimizer
    else:
        pairs = [(param, param) for group in optimizer.param_groups for param in group["params"]]
        adam = optimizer
    names = {id(param): name for name, param in engine.module.named_parameters()}
    # A pipeline's engine keeps its grid as its mpu (its tp rank: the grid's model axis);
    # otherwise AutoTP registered the tensor-parallel group with DeepSpeed's groups.
    rank = (engine.mpu or groups).get_tensor_model_parallel_rank()
    zero = folder / "zero"
    # Each group's hyperparameters as saved, the learning rate of the step reached included
    # (the schedule sets it again only at its next step), as ZeRO's universal loading does.
    for group, saved in zip(adam.param_groups, saved_groups(zero), strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})
    with torch.no_grad():
        for weight, master in pairs:
            name = names[id(weight)]
            master.copy_(_shard(weight, zero / name / "fp32.pt", "fp32", rank=rank, tp=tp))
            if weight is not master:
                weight.copy_(master)
            step = safe_load.load(zero / name / "step.pt")
            adam.state[master] = {
                "step": torch.as_tensor(step, dtype=torch.float32).clone(),
                **{
                    key: _shard(weight, zero / name / f"{key}.pt", key, rank=rank, tp=tp).to(master.device)
                    for key in ADAM_MOMENTS
                },
            }


__all__ = ["engine_loading", "load"]
