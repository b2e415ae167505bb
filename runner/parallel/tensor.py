"""Tensor parallelism through DeepSpeed's AutoTP: which weights are split, and how.

Megatron-LM's partitioning (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3): in each
block the first matmul is split by columns (its output features) and the second by rows
(its input features), so a block needs one all-reduce in forward (after the row-parallel
matmul) and one in backward (of the column-parallel matmul's input gradient):

- attention: ``wq``, ``wk``, ``wv`` column-parallel, so each rank holds whole heads
  (n_head / tp query heads, n_kv_head / tp key/value heads); ``wo`` row-parallel;
- SwiGLU MLP: ``w1`` (gate) and ``w3`` (up) column-parallel, ``w2`` (down) row-parallel.

The output head and the token embedding are split by vocabulary (Megatron-LM's parallel
input and output embeddings, same paper, Sec. 3): each rank holds ceil(V / tp) rows of
each. The head computes this rank's slice of the logits, never the whole (b, s, V)
tensor, and the loss is DeepSpeed's vocabulary-parallel cross-entropy, which all-reduces
each token's max, sum of exponentials and target logit over the group
(deepspeed/sequence/cross_entropy.py, installed through runner/model/transformer.py's
``Transformer.loss_function``). The embedding is DeepSpeed's ``VocabParallelEmbedding``:
each rank looks up the tokens of its slice and the group sums the lookups; AutoTP makes
it for a tied embedding (one weight with the head), ``split_token_embedding`` for an
untied one. The RMSNorm gains stay whole on every rank: their inputs and gradients are
identical across the group, so their gradients agree without a reduction.

DeepSpeed's mesh (``deepspeed/utils/groups.py``, ``_init_tp_mesh_device``) is
(data_parallel, tensor_parallel) with tensor-parallel innermost: ranks
``tp*d .. tp*d + tp-1`` form one tensor-parallel group and share data-parallel index
``d = rank // tp``, which is how runner/train/rank.py hands out batches (both ranks of a group
see the same micro-batches, as AutoTP checks on the first forward).

What this split needs of the model (tp divides the heads and the MLP width) and of the
cluster (a group inside one node) are rules of runner/rules/tensor_split.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.config import ZeroStage
from runner.rundir.json_types import JsonObject

if TYPE_CHECKING:  # the launching process builds DeepSpeed's config from here without torch
    import torch

    from runner.model.transformer import Transformer

# Parameter-name patterns (runner/model/transformer.py keeps Meta's Llama names), matched by
# AutoTP with re.match against e.g. "layers.0.attention.wq.weight".
COLUMN_PARALLEL = (r".*\.attention\.w[qkv]\.weight$", r".*\.feed_forward\.w[13]\.weight$")
ROW_PARALLEL = (r".*\.attention\.wo\.weight$", r".*\.feed_forward\.w2\.weight$")


def partition_config() -> JsonObject:
    """AutoTP's ``partition_config`` for runner/model/transformer.py's Transformer (column/row by name)."""
    return {
        # Only these specs: AutoTP's built-in ones target HuggingFace names, and any
        # Linear they do not match (the output head) stays replicated.
        "use_default_specs": False,
        # The output head, split by vocabulary (tensor_parallel_section's vocab_parallel_lm_head).
        "lm_head_patterns": ["output"],
        "layer_specs": [
            {"patterns": list(ROW_PARALLEL), "partition_type": "row"},
            {"patterns": list(COLUMN_PARALLEL), "partition_type": "column"},
        ],
    }


def tensor_parallel_section(tp: int) -> JsonObject:
    """DeepSpeed's ``tensor_parallel`` section; empty at tp 1 (AutoTP off)."""
    if tp == 1:
        return {}
    return {
        "tensor_parallel": {
            "autotp_size": tp,
            "partition_config": partition_config(),
            "vocab_parallel_lm_head": True,
        }
    }


def deepspeed_train_batch_size(*, global_size: int, tp: int, zero_stage: int) -> int | None:
    """The ``train_batch_size`` DeepSpeed's check wants, or None where it must be left out.

    DeepSpeed 0.19 parses its config before AutoTP builds the mesh, so at stages 0-2 it
    checks train_batch = micro x accum x world_size, counting each tensor-parallel rank as
    a data-parallel one: tp times the real global batch. At stage 3 it checks again against
    the data-parallel size after the mesh exists, so no single value passes both (seen
    with 2 ranks, tp 2, micro 4, accum 4: 32 fails "32 != 4 * 4 * 1", 16 fails
    "16 != 4 * 4 * 2"); left out, it is derived from micro x accum at each check.
    """
    if tp == 1:
        return global_size
    if ZeroStage(zero_stage) is ZeroStage.zero3:
        return None
    return global_size * tp


def is_sharded(param: torch.nn.Parameter) -> bool:
    """Whether AutoTP split this parameter over the tensor-parallel group (it tags the shards)."""
    # deepspeed/module_inject/layers.py marks each replaced layer's weight with
    # DS_TENSOR_MODEL_PARALLEL = "tensor_model_parallel".
    return bool(getattr(param, "tensor_model_parallel", False))


def grad_norm(module: torch.nn.Module, *, tp: int) -> float:
    """L2 norm of the full model's gradient from this rank's shards and replicated parameters."""
    return params_grad_norm(list(module.parameters()), tp=tp)


def params_grad_norm(params: list[torch.nn.Parameter], *, tp: int) -> float:
    """L2 norm of these parameters' whole gradients, from this rank's shards and replicated ones.

    A sharded weight's squares are summed over the tensor-parallel group; a replicated
    one's gradient is the same on every rank of the group, so it is counted once. Every
    rank of the group calls it (a collective when tp > 1).
    """
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch

    sharded_sq = torch.zeros((), dtype=torch.float64)
    replicated_sq = torch.zeros((), dtype=torch.float64)
    for param in params:
        if param.grad is None:
            continue
        sq = param.grad.detach().double().square().sum().cpu()
        if is_sharded(param):
            sharded_sq += sq
        else:
            replicated_sq += sq
    if tp > 1:
        # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
        import torch.distributed as dist
        from deepspeed.utils import groups

        device = params[0].device if params else torch.device("cpu")
        total = sharded_sq.to(device)
        dist.all_reduce(total, group=groups.get_tensor_model_parallel_group())
        sharded_sq = total.cpu()
    return float((sharded_sq + replicated_sq).sqrt())


def grid_grad_norm(params: list[torch.nn.Parameter], grid: Any) -> torch.Tensor:
    """L2 norm of the whole model's gradient under a pipeline, from this rank's stage (and shard).

    ``params``: this stage's parameters, or one optimizer group of them; ``grid``:
    DeepSpeed's PipelineParallelGrid, whose model-parallel group is the ranks of one
    data-parallel index (pipe x tp). Each stage adds its own squares over that group: a
    tied embedding once (DeepSpeed marks the other copy ``ds_pipe_replicated``; its
    gradient is the same after the tied all-reduce), a shard on every tensor-parallel rank,
    a weight held whole by the group (the norms) on the group's first rank only. Every rank
    of the group calls it (a collective).
    """
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch
    import torch.distributed as dist

    first_of_slice = grid.get_slice_parallel_rank() == 0
    own = [
        p.grad.detach().float().pow(2).sum()
        for p in params
        if p.grad is not None
        and not getattr(p, "ds_pipe_replicated", False)
        and (first_of_slice or is_sharded(p))
    ]
    device = params[0].device if params else torch.device("cpu")
    sq = torch.stack(own).sum() if own else torch.zeros((), device=device)
    dist.all_reduce(sq, group=grid.get_model_parallel_group())
    return sq.sqrt()


def split_token_embedding(model: Transformer, *, tp: int) -> None:
    """Split an untied token embedding by vocabulary over the tensor-parallel group, in place.

    AutoTP splits the output head by vocabulary, and a tied embedding with it; an untied
    one it leaves whole. DeepSpeed's ``VocabParallelEmbedding`` (module_inject/layers.py)
    keeps this rank's ceil(V / tp) rows of it: each rank looks up the tokens of its slice
    and the group sums the lookups (Megatron-LM's vocabulary-parallel embedding). Made
    before DeepSpeed's engine, on the engine's (data, tensor) mesh, so the optimizer only
    ever sees the slice; under zero.Init the table is gathered whole once to cut it, as
    AutoTP does for the weights it splits.
    """
    if tp == 1 or model.cfg.tie_embeddings:  # AutoTP splits a tied one with the head
        return
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    import deepspeed
    from deepspeed.module_inject.layers import VocabParallelEmbedding, set_autotp_mode
    from deepspeed.utils import groups
    from torch import nn

    groups._init_tp_mesh_device(tensor_model_parallel_size=tp)
    set_autotp_mode(training=True)  # as the engine sets it; in inference mode the slice is frozen
    embedding = model.tok_embeddings
    if hasattr(embedding.weight, "ds_id"):  # partitioned by zero.Init (runner/engine/zero_init.py)
        with deepspeed.zero.GatheredParameters([embedding.weight], modifier_rank=None):
            whole = embedding.weight.data.clone()
        embedding = nn.Embedding(whole.shape[0], whole.shape[1], _weight=whole)
    split = VocabParallelEmbedding(embedding, groups.get_tensor_model_parallel_group(), name="tok_embeddings")
    split.replaced = True  # AutoTP's walk leaves a replaced module alone
    model.tok_embeddings = split
