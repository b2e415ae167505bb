"""Which runs take ``model.offload_activations``: the checkpointed blocks' inputs in host memory.

Full recompute keeps one tensor a block, its input, which DeepSpeed's offload moves to the host
(runner/model/activation_offload.py). The other modes keep tensors inside each block that it
does not mark, so it would move nothing. A pipeline runs its micro-batches' forwards and
backwards interleaved inside DeepSpeed's engine, where ladder opens no offload around one
micro-batch.
"""

from __future__ import annotations

from runner.config import ModelConfig, Recompute


def activation_offload_problems(model: ModelConfig, *, recompute: Recompute, pp: int) -> list[str]:
    """Why ``model.offload_activations=true`` cannot be taken by a layout of this recompute mode
    and pipeline degree (empty when it can)."""
    if not model.offload_activations:
        return []
    problems = []
    mode = recompute
    if mode != Recompute.full:
        problems.append(
            f"model.offload_activations=true with model.activation_checkpointing={mode.value}: only "
            "full recompute keeps a block's input alone, the tensor it offloads; set "
            "model.activation_checkpointing=full or model.offload_activations=false"
        )
    if pp > 1:
        problems.append(
            f"model.offload_activations=true with parallel.pp={pp}: DeepSpeed's pipeline engine "
            "interleaves micro-batches' forwards and backwards, and ladder opens the offload around "
            "one micro-batch's; set model.offload_activations=false or parallel.pp=1"
        )
    return problems


__all__ = ["activation_offload_problems"]
