"""Op-level selective activation checkpointing: keep the matmuls' and attention's outputs, rerun the rest.

``model.activation_checkpointing=selective`` runs each block under torch.utils.checkpoint with
a selective-checkpoint policy (``torch.utils.checkpoint.create_selective_checkpoint_contexts``),
as torchtitan's op-level SAC does (torchtitan/models/llama3/infra/parallelize.py,
``_apply_ac_to_transformer_block``): the outputs of the attention kernel and of every second
matmul in forward order are saved, and backward reruns only the cheap elementwise ops (the
norms, RoPE, SwiGLU's product and silu) and the other matmuls. In runner/model/transformer.py's
block the matmuls run as wq, wk, wv, wo, w1, w3, w2: wq, wv, w1 and w2 are kept and wk, wo
and w3 run again (:data:`RECOMPUTED_MATMULS`). The memory model counts what this keeps
(runner/memory_model/activations.py) and the time model what it reruns
(runner/step_time/calibrated_terms.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

# The block's matmuls in forward order (runner/model/transformer.py Attention and FeedForward).
FORWARD_MATMULS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
RECOMPUTED_MATMULS = FORWARD_MATMULS[1::2]  # every second one: wk, wo, w3


@functools.cache
def _saved_ops() -> tuple[frozenset[Any], frozenset[Any]]:
    """(the matmul ops counted, the attention kernels kept). Deferred: the planner reads the names
    above without torch."""
    import torch  # deferred: the planner reads this module's names without torch

    aten = torch.ops.aten
    # A linear with a bias (Qwen2's q, k, v) is an addmm: a matmul for the count like any other.
    matmuls = frozenset({aten.mm.default, aten.addmm.default})
    attention = frozenset(
        {
            aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_cudnn_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
        }
    )
    return matmuls, attention


# Set while ops run whose outputs the policy must not keep (:func:`outputs_not_kept`).
_not_kept: contextvars.ContextVar[bool] = contextvars.ContextVar("ladder_outputs_not_kept", default=False)


@contextlib.contextmanager
def outputs_not_kept() -> Iterator[None]:
    """Ops run inside are neither kept nor counted by op-level recompute's policy (the MLP's pieces,
    which DeepSpeed's TiledMLP runs without grad and again in its own backward)."""
    token = _not_kept.set(True)
    try:
        yield
    finally:
        _not_kept.reset(token)


# Lists collecting the outputs the policy keeps, while :func:`kept_outputs` is open.
_recorders: list[list[Any]] = []


@contextlib.contextmanager
def kept_outputs() -> Iterator[list[Any]]:
    """The outputs op-level recompute keeps for backward, collected while this is open: torch's
    selective checkpoint holds them in its own cache, not among autograd's saved tensors, so the
    memory ledger (runner/metrics/ledger.py ``saved_activations``) counts them from here."""
    outputs: list[Any] = []
    _recorders.append(outputs)
    try:
        yield outputs
    finally:
        _recorders.remove(outputs)


def _policy(counts: dict[str, int], ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Save the attention's outputs and every odd matmul's (counted apart in forward and recompute).

    An op inside :func:`outputs_not_kept` is neither kept nor counted: DeepSpeed's TiledMLP
    (``model.mlp_tiles``) runs the MLP's pieces without grad in forward and in the recompute, and
    again with grad in its own backward, so what the policy would keep of them is never read.
    (Grad mode itself does not tell them apart: ZeRO-3's linear runs its matmul inside an
    autograd.Function's forward, without grad too, and that output is read.)
    """
    from torch.utils.checkpoint import CheckpointPolicy  # deferred: as _saved_ops

    if _not_kept.get():
        return CheckpointPolicy.PREFER_RECOMPUTE
    matmuls, attention = _saved_ops()
    save = func in attention
    if func in matmuls:
        mode = "recompute" if ctx.is_recompute else "forward"
        counts[mode] += 1
        save = counts[mode] % 2 == 1
    if not save:
        return CheckpointPolicy.PREFER_RECOMPUTE
    if not ctx.is_recompute:
        for outputs in _recorders:
            outputs.append(ctx.op_output)
    return CheckpointPolicy.MUST_SAVE


def op_level_contexts() -> tuple[Any, Any]:
    """torch.utils.checkpoint's ``context_fn`` for one block's forward and its recompute."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts  # deferred: as _saved_ops

    return create_selective_checkpoint_contexts(functools.partial(_policy, {"forward": 0, "recompute": 0}))


__all__ = ["FORWARD_MATMULS", "RECOMPUTED_MATMULS", "kept_outputs", "op_level_contexts"]
