"""Sequence parallelism (DeepSpeed-Ulysses) on ladder's Transformer, through DeepSpeed's own parts.

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509), as DeepSpeed's Arctic Long Sequence
Training runs it with ZeRO (ALST, arXiv 2506.13996; deepspeed/runtime/sequence_parallel/):

- the ranks form groups of ``sp`` consecutive ranks (DeepSpeed's
  ``parallel_state_sp.initialize_sequence_parallel``); each rank of a group holds
  ``seq_len / sp`` tokens of every sample of its data-parallel rank's micro-batch, the group's
  ``sp_rank``-th piece (:meth:`SequenceShard.piece`), and runs the embedding, every projection,
  the MLP, the norms and the loss on those tokens only;
- each attention is DeepSpeed's ``DistributedAttention`` (deepspeed/sequence/layer.py): an
  all-to-all trades the query, key and value pieces (B, T/sp, heads, head size) for whole
  sequences of ``heads / sp`` heads (B, T, heads/sp, head size), the causal attention runs over the
  whole sequence, and a fourth all-to-all trades its output back; backward runs the four
  all-to-alls' transposes. RoPE rotates each piece by its tokens' positions in the sample before
  the exchange;
- DeepSpeed, given this ``mpu``, reduces the gradients over the group's ranks and the
  data-parallel ranks together, and scales them two ways. ZeRO 0-2 sum over the sequence ranks
  and average over the data-parallel ones (runtime/zero/stage_1_and_2.py divides by
  ``world / sequence_parallel_size``; engine.py ``_reduce_non_expert_gradients`` at stage 0).
  ZeRO-3 averages over all of them: its reduce-scatter (runtime/comm/coalesced_collectives.py
  ``reduce_scatter_coalesced``, the path ``reduce_scatter: true`` takes) divides by the whole
  group. Each rank's loss is the mean over its own tokens, so at ZeRO 0-2 a rank backpropagates
  that mean over ``sp`` (:func:`backward_loss`): either way the gradient is the samples' mean's,
  as without sp (tests/multirank/test_layout_invariance.py compares the gradient norms).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from runner.config import ZeroStage
from runner.model.sequence_shard import SequenceShard


def sequence_groups(sp: int) -> ModuleType:
    """DeepSpeed's sequence and sequence-data groups for groups of ``sp`` consecutive ranks, made
    once on every rank (a collective); the module is the ``mpu`` ``deepspeed.initialize`` takes."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    parallel_state_sp.initialize_sequence_parallel(sp)
    return parallel_state_sp


def split_sequence(model: nn.Module, groups: ModuleType) -> SequenceShard:
    """Make ``model`` (runner/model/transformer.py's Transformer) run this rank's piece of every
    sample, its attentions through DeepSpeed's ``DistributedAttention`` over ``groups``' sequence
    group; the shard it runs."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.sequence.layer import DistributedAttention

    shard = SequenceShard(
        group=groups.get_sequence_parallel_group(),
        rank=groups.get_sequence_parallel_rank(),
        size=groups.get_sequence_parallel_world_size(),
    )
    for block in model.layers:  # type: ignore[union-attr]
        attention = block.attention
        # Batch first: the heads (dim 2) are scattered and the sequence (dim 1) gathered.
        attention.sequence_attention = DistributedAttention(
            attention.local_attention, shard.group, scatter_idx=2, gather_idx=1
        )
    model.sequence_shard = shard  # type: ignore[assignment]
    return shard


def backward_loss(loss: torch.Tensor, *, sp: int, zero_stage: ZeroStage) -> torch.Tensor:
    """The loss a rank backpropagates: its tokens' mean over ``sp`` where DeepSpeed sums the
    gradients over the sequence group (ZeRO 0-2; the module's docstring), else the mean itself."""
    return loss if sp == 1 or zero_stage is ZeroStage.zero3 else loss / sp


__all__ = ["SequenceShard", "backward_loss", "sequence_groups", "split_sequence"]
