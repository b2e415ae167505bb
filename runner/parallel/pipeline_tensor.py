"""Tensor parallelism inside pipeline stages: each stage's layers split over its tensor-parallel group.

Without a pipeline, DeepSpeed's engine applies AutoTP to the whole model
(runner/parallel/tensor.py). Its pipeline engine takes the pipeline grid as its model
parallel unit instead, and AutoTP would replace that grid's groups with its own
(deepspeed/runtime/engine.py ``_configure_tensor_parallel_states``, 0.19.8). So under a
pipeline the stage is split here, with AutoTP's own layer classes
(deepspeed/module_inject/layers.py) and the same rules, on the grid's tensor-slicing
group, and DeepSpeed's config has no ``tensor_parallel`` section.

The grid is DeepSpeed's ``PipeModelDataParallelTopology``: axes (pipe, data, model) with
model innermost, so the ``tp`` ranks of a tensor-parallel group are adjacent (inside one
node) and share their pipeline stage and data-parallel index; ranks ``s*dp*tp ..
(s+1)*dp*tp - 1`` hold stage ``s`` (Narayanan et al. 2021, arXiv 2104.04473, Sec. 3: PTD-P,
tensor parallelism inside a node, pipeline across nodes).

What is split, as without a pipeline (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3):

- each block: ``wq``, ``wk``, ``wv``, ``w1``, ``w3`` by columns (``LinearLayer``), ``wo``
  and ``w2`` by rows (``LinearAllreduce``), by AutoTP itself with runner/parallel/tensor.py's
  partition config;
- the first stage's embedding by vocabulary (``VocabParallelEmbedding``); the last stage's
  output head by vocabulary (``VocabParallelLinear``), its logits left as this rank's
  slice, and the loss DeepSpeed's vocabulary-parallel cross-entropy over the group;
- a tied embedding: its copy on the first stage and its copy on the last are each split
  by vocabulary the same way, so DeepSpeed's tied-weight all-reduce (one group per
  tensor-parallel rank, runtime/pipe/module.py ``_index_tied_modules``) sums matching
  slices; the head multiplies by this rank's slice.

A stage is born cut: its layers are made on the meta device (shapes only), cut there,
and only then given memory on the rank's device, where each shard's initial values are
written (runner/parallel/pipeline.py ``_init_stage``): the same weights as every other layout,
and no rank ever holds more than its shard.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from runner.model.meta import materialize
from runner.parallel.shard_build import autotp_replace


def output_head(embedding: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A tied output head on the last stage: (B, T, C) -> logits (B, T, V), or this rank's V / tp.

    Under tensor parallelism ``embedding`` is DeepSpeed's ``VocabParallelEmbedding``: the
    head is then column-parallel over the vocabulary, identity in forward and an all-reduce
    of the input's gradient in backward (Megatron's f operator), as ``VocabParallelLinear``.
    """
    mp_group = getattr(embedding, "mp_group", None)
    if mp_group is not None:
        # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
        from deepspeed.module_inject.layers import ColumnParallel

        x = ColumnParallel.apply(mp_group, x)
    return F.linear(x, cast(torch.Tensor, embedding.weight))


class VocabParallelLoss:
    """``lm_loss`` of a vocabulary slice of the logits: DeepSpeed's vocabulary-parallel cross-entropy.

    Each rank holds logits for vocabulary rows [start, end) of its group; the loss
    all-reduces each token's max, sum of exponentials and target logit over the group
    (deepspeed/sequence/cross_entropy.py), in fp32, so every rank gets the whole model's
    mean next-token loss.
    """

    def __init__(self, head: nn.Module) -> None:
        # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
        from deepspeed.sequence.cross_entropy import VocabParallelCausalLMLoss

        self.loss = VocabParallelCausalLMLoss(
            tp_group=head.mp_group,
            vocab_start_index=head.vocab_start_index,
            vocab_end_index=head.vocab_end_index,
        )

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(logits, shift_labels=targets)


def _replace_layer(pipe: Any, old: nn.Module, new: nn.Module) -> None:
    """Put ``new`` where ``old`` was in the PipelineModule: its child, and its forward functions."""
    for name, child in list(pipe.named_children()):
        if child is old:
            setattr(pipe, name, new)
    for index, func in enumerate(pipe.forward_funcs):
        if func is old:
            pipe.forward_funcs[index] = new
        elif isinstance(func, functools.partial) and func.args and func.args[0] is old:
            pipe.forward_funcs[index] = functools.partial(func.func, new, *func.args[1:])


def split_stage(pipe: Any, *, embedding_type: type[nn.Embedding], head_type: type[nn.Linear]) -> None:
    """Split this rank's stage of ``pipe`` over the grid's tensor-parallel group, in place.

    ``embedding_type`` and ``head_type`` are runner/parallel/pipeline.py's lookup and untied head
    layers. The last stage's ``loss_fn`` becomes the vocabulary-parallel loss.
    """
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.module_inject.layers import VocabParallelEmbedding, VocabParallelLinear

    grid = pipe._grid
    tp = grid.get_slice_parallel_world_size()
    if tp == 1:
        return
    group = grid.get_slice_parallel_group()
    # The blocks' matrices by AutoTP's own rules, as without a pipeline; it leaves the
    # embedding and the head (no layer of a stage is named "output") to the lines below.
    autotp_replace(pipe, tp=tp, group=group, vocab_parallel_head=False)
    head: nn.Module | None = None
    tied_ids = {id(module) for module in pipe.tied_modules.values()}
    for func in list(pipe.forward_funcs):
        if isinstance(func, embedding_type) and id(func) not in tied_ids:  # a tied one: below
            _replace_layer(pipe, func, VocabParallelEmbedding(func, group, name="tok_embeddings"))
        elif isinstance(func, head_type):
            head = VocabParallelLinear(func, group, name="output")
            _replace_layer(pipe, func, head)
    for key, tied in list(pipe.tied_modules.items()):
        split = VocabParallelEmbedding(tied, group, name="tok_embeddings")
        pipe.tied_modules[key] = split
        if key in getattr(pipe, "tied_comms", {}):  # not made yet while the stage is built
            pipe.tied_comms[key]["module"] = split
        _replace_layer(pipe, tied, split)
        if any(isinstance(f, functools.partial) and f.args[0] is split for f in pipe.forward_funcs):
            head = split  # this stage computes the tied head from its slice
    if head is not None:
        pipe.loss_fn = VocabParallelLoss(head)
    # How each of this stage's tensors is split, for DeepSpeed's universal checkpoint, as
    # AutoTP's engine records it for a whole model; runner/checkpoint/universal_conversion.py
    # joins the stages'.
    from deepspeed.checkpoint import UNIVERSAL_CHECKPOINT_INFO
    from deepspeed.module_inject.layers import collect_autotp_universal_checkpoint_info

    setattr(pipe, UNIVERSAL_CHECKPOINT_INFO, collect_autotp_universal_checkpoint_info(pipe))


def cut_pipeline_module(
    device: torch.device, *, embedding_type: type[nn.Embedding], head_type: type[nn.Linear], **kwargs: Any
) -> Any:
    """DeepSpeed's PipelineModule(**kwargs) whose stage is built on meta, cut, then put on ``device``.

    DeepSpeed builds the stage's layers in ``_build`` and moves them to the accelerator
    right after (runtime/pipe/module.py, 0.19.8); the grid and its groups exist before.
    """
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.pipe import PipelineModule

    class CutPipelineModule(PipelineModule):
        def _build(self) -> None:
            with torch.device("meta"):
                super()._build()
            split_stage(self, embedding_type=embedding_type, head_type=head_type)
            materialize(self, device)

    return CutPipelineModule(**kwargs)
