"""Building only a rank's tensor-parallel shard of a model: cut on the meta device, then allocated.

DeepSpeed's AutoTP (deepspeed/module_inject) cuts a model that exists: each replaced layer
splits its weight and keeps this rank's slice. Run on a model made on the meta device, it
cuts shapes only, and its layers record what they cut (the whole shape, the split sizes,
this rank's index). Only then is memory allocated, on the rank's device, for the shards
alone, and each shard is written from its slice of the initial values runner/model/transformer.py
draws by name and seed: the same weights as every other layout, and no rank ever holds a
whole weight. runner/parallel/pipeline_tensor.py builds pipeline stages this way, and
``build_cut_model`` a whole model for ZeRO 0-2 with tensor parallelism.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from runner.config import ModelConfig
from runner.model.hf_weights import write_shard, write_values
from runner.model.meta import materialize
from runner.model.transformer import Transformer, build_model


def shard_offsets(module: nn.Module) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    """For each tensor-parallel weight (and column-parallel bias) under ``module``, by id: the dim
    it is cut along, where this rank's slice starts, and the whole tensor's shape."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.module_inject.layers import LinearAllreduce, TensorParallel_Layer

    offsets = {}
    for layer in module.modules():
        if isinstance(layer, TensorParallel_Layer) and getattr(layer, "is_tp_parallel", False):
            dim = 1 if isinstance(layer, LinearAllreduce) else 0  # row-parallel: input features
            start = sum(layer._partition_sizes[: layer.tp_index])
            whole = tuple(layer._orig_weight_shape)
            offsets[id(layer.weight)] = (dim, start, whole)
            if dim == 0 and getattr(layer, "bias", None) is not None:
                offsets[id(layer.bias)] = (0, start, whole[:1])  # a column-parallel bias: cut with its rows
    return offsets


@torch.no_grad()
def write_initial_weights(
    module: nn.Module, cfg: ModelConfig, *, seed: int, name_of: Callable[[str], str] | None = None
) -> None:
    """Write every parameter's initial values (a shard: its slice of the whole weight's), drawn,
    or read from ``cfg.init_from`` (runner/model/hf_weights.py).

    ``name_of(name)`` maps a parameter name of ``module`` to runner/model/transformer.py's name (default:
    the same); a tied weight is written once, under its first name.
    """
    shards = shard_offsets(module)
    for name, param in module.named_parameters():
        whole = name if name_of is None else name_of(name)
        if id(param) in shards:
            dim, start, shape = shards[id(param)]
            write_shard(param, cfg, whole, shape, seed=seed, dim=dim, start=start)
        else:
            write_values(param, cfg, whole, param.shape, seed=seed)


def autotp_replace(module: nn.Module, *, tp: int, group: Any, vocab_parallel_head: bool) -> None:
    """Replace ``module``'s layers by AutoTP's, as DeepSpeed's engine would, over ``group``.

    The same AutoTP and partition config (runner/parallel/tensor.py ``partition_config``)
    as deepspeed/runtime/engine.py ``_apply_autotp_partitioning`` (0.19.8), in training
    mode. ``vocab_parallel_head``: the head named ``output`` is split by vocabulary (a
    pipeline stage has no such name; runner/parallel/pipeline_tensor.py splits its own).
    """
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.module_inject.auto_tp import AutoTP
    from deepspeed.module_inject.autotp_config import AutoTPConfig
    from deepspeed.module_inject.layers import set_autotp_mode

    from runner.parallel.tensor import partition_config

    set_autotp_mode(training=True)  # as the engine sets it; in inference mode no gradient is reduced
    config = AutoTPConfig.from_dict(partition_config())
    config.tp_size = tp
    autotp = AutoTP(
        module=module,
        all_reduce_linears=(),
        prefix="",
        state_dict=None,
        linear_layer_setting=(nn.Linear, nn.Embedding),
        orig_layer_impl=None,
        keep_module_on_host=False,
        partition_config=config,
        vocab_parallel_lm_head=vocab_parallel_head,
        model_config=None,
        tp_grain_size=1,
        training_mode=True,
    )
    # set_tensor_parallel_config(tp, group) takes DeepSpeed's global mesh in training mode
    # (auto_tp.py, 0.19.8), which a pipeline's grid does not make: the group is set here.
    autotp.mp_group, autotp.mp_size = group, tp
    autotp.update_linear_policies()
    autotp._replace_module(module)


def autotp_cut(model: Transformer, *, tp: int) -> None:
    """Cut ``model`` over the engine's tensor-parallel group as DeepSpeed's engine would, in place.

    ``autotp_replace``, then the engine's finishing steps: the vocabulary-parallel loss and
    the universal-checkpoint metadata; the model is marked ``ds_autotp_parsed``, which the
    engine takes as already cut. The untied embedding is split as runner/parallel/tensor.py
    ``split_token_embedding`` splits it.
    """
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.checkpoint import UNIVERSAL_CHECKPOINT_INFO
    from deepspeed.module_inject.layers import VocabParallelLinear, collect_autotp_universal_checkpoint_info
    from deepspeed.sequence.cross_entropy import configure_vocab_parallel_loss
    from deepspeed.utils import groups

    from runner.parallel.tensor import split_token_embedding

    groups._init_tp_mesh_device(tensor_model_parallel_size=tp)  # as the engine makes it
    split_token_embedding(model, tp=tp)  # first, as it ran before the engine's AutoTP
    autotp_replace(model, tp=tp, group=groups.get_tensor_model_parallel_group(), vocab_parallel_head=True)
    head = model.output
    if not isinstance(head, VocabParallelLinear):
        raise RuntimeError(f"AutoTP left the output head as {type(head).__name__}, not split by vocabulary")
    configure_vocab_parallel_loss(model, head)
    setattr(model, UNIVERSAL_CHECKPOINT_INFO, collect_autotp_universal_checkpoint_info(model))
    setattr(model, "ds_autotp_parsed", True)  # noqa: B010 (typed: nn.Module attributes are tensors or modules)


def build_cut_model(
    cfg: ModelConfig, *, tp: int, seed: int, device: torch.device, dtype: torch.dtype
) -> Transformer:
    """This rank's tensor-parallel shard of the whole model, allocated on ``device`` only."""
    model = build_model(cfg, device="meta", dtype=dtype)
    autotp_cut(model, tp=tp)
    materialize(model, device)
    write_initial_weights(model, cfg, seed=seed)
    model.init_rope(device)
    return model
