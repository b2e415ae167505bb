"""One transformer block, timed as the run will run it: the in-place check on the step model's parts.

The step model (runner/step_time/micro_batch_compute.py) adds a block's GEMMs, attention, memory-bound
kernels and op dispatch from separate micro-benchmarks. Run back to back inside a real block,
those kernels are slower than alone: on a 2-core CPU the block's GEMMs ran about 17% below
their measured rate (llama-style gpt2_124m shape, micro 2, seq 128, profiled), as each
kernel starts on data the one before left in another core's cache. This measures the real
thing: ``runner.model.transformer.TransformerBlock`` at the run's width, micro-batch and
sequence, forward then backward, in the run's dtype; the step model scales the block's parts
by the ratio of this time to their sum.

:func:`rest_seconds` times the block's non-GEMM part alone (eager or compiled), and
:func:`cross_entropy_seconds` the loss over the vocabulary: the step model's ``elementwise``
and ``dispatch`` terms where they were measured.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runner.config import ModelConfig, Recompute


def block_seconds(cfg: ModelConfig, micro: int, seq: int, *, dtype: Any, device: Any) -> float:
    """Seconds of one block's forward and backward at (micro, seq), the median of a few."""
    import torch  # deferred: only a plan that measures this host's device times a block

    from runner.hardware.calibrate import timed
    from runner.model.transformer import TransformerBlock, rope_cache

    cfg = dataclasses.replace(cfg, activation_checkpointing=Recompute.none)
    cos, sin = rope_cache(cfg, seq)
    cos, sin = cos.to(device), sin.to(device)

    def block_step() -> Any:
        """A block of its own, and its forward + backward (each neighbour thread gets one)."""
        block = TransformerBlock(cfg).to(device=device, dtype=dtype)
        with torch.no_grad():
            for param in block.parameters():
                if param.dim() > 1:
                    param.normal_(0.0, cfg.init_std)
        x = torch.randn(micro, seq, cfg.d_model, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn_like(x)

        def step() -> None:
            block(x, cos, sin).backward(grad)
            for param in block.parameters():
                param.grad = None
            x.grad = None

        return step

    return timed(block_step(), device, repeats=5, warmup=2, beside=block_step, median=True)


def non_gemm_step(
    cfg: ModelConfig,
    micro: int,
    seq: int,
    *,
    dtype: Any,
    device: Any,
    compiled: bool = False,
    head_dim: int | None = None,
) -> Any:
    """One block's non-GEMM part, forward and backward, at (micro, seq), as a call: everything
    ``TransformerBlock`` runs besides its seven projections and the SDPA kernel.

    The block's own code path between those kernels, with the real modules
    (runner/model/transformer.py ``RMSNorm``, ``apply_rope``): both norms, the head views and
    transposes, RoPE on q and k, GQA's repeat, the attention output's reshape, SwiGLU's
    ``silu(a) * b``, both residual adds. The projections' and the kernel's outputs enter as
    leaf tensors, and their inputs' gradients leave as the backward's roots, so every op's
    backward runs too. ``compiled``: the same function under ``torch.compile``, as
    runner/engine/compile_blocks.py compiles the block (its GEMMs stay library calls).
    ``head_dim``: a tensor-parallel rank's heads keep the model's width each (default
    ``d_model // n_head``). Each call of the result makes its own tensors (a neighbour thread's
    copy of the work); calling what that returns runs the part once."""
    import torch  # deferred: only a plan that measures or counts a block builds one
    import torch.nn.functional as F

    from runner.model.shape import n_kv_head
    from runner.model.transformer import RMSNorm, apply_rope, rope_cache

    heads, kv = cfg.n_head, n_kv_head(cfg)
    hs = cfg.d_model // cfg.n_head if head_dim is None else head_dim
    cos, sin = (t.to(device) for t in rope_cache(dataclasses.replace(cfg, n_head=cfg.d_model // hs), seq))
    norms = [RMSNorm(cfg.d_model, cfg.norm_eps).to(device=device, dtype=dtype) for _ in range(2)]

    def rest(x: Any, q: Any, k: Any, v: Any, attn: Any, wo: Any, w1: Any, w3: Any, w2: Any) -> Any:  # noqa: PLR0913
        """TransformerBlock.forward without its GEMMs and SDPA: the tensors those would consume."""
        b, t = x.shape[0], x.shape[1]
        n1 = norms[0](x)
        qh = q.view(b, t, heads, hs).transpose(1, 2)
        kh = k.view(b, t, kv, hs).transpose(1, 2)
        vh = v.view(b, t, kv, hs).transpose(1, 2)
        qr, kr = apply_rope(qh, cos, sin), apply_rope(kh, cos, sin)
        if heads > kv:
            kr, vh = kr.repeat_interleave(heads // kv, dim=1), vh.repeat_interleave(heads // kv, dim=1)
        y = attn.transpose(1, 2).reshape(b, t, heads * hs)
        x2 = x + wo
        n2 = norms[1](x2)
        gate = F.silu(w1) * w3
        return n1, qr, kr, vh, y, n2, gate, x2 + w2

    fn = torch.compile(rest) if compiled else rest
    widths = [cfg.d_model, heads * hs, kv * hs, kv * hs]

    def make() -> Any:
        """Its leaf tensors and one forward + backward over them (each neighbour thread gets its own)."""

        def leaf(*shape: int) -> Any:
            return torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)

        leaves = [leaf(micro, seq, w) for w in widths]
        leaves += [leaf(micro, heads, seq, hs), leaf(micro, seq, cfg.d_model)]
        leaves += [
            leaf(micro, seq, cfg.ffn_hidden),
            leaf(micro, seq, cfg.ffn_hidden),
            leaf(micro, seq, cfg.d_model),
        ]
        with torch.no_grad():
            grads = [torch.randn_like(out) for out in fn(*leaves)]

        def step() -> None:
            torch.autograd.backward(fn(*leaves), grads)
            for tensor in leaves:
                tensor.grad = None

        return step

    return make


def rest_seconds(
    cfg: ModelConfig, micro: int, seq: int, *, dtype: Any, device: Any, compiled: bool = False
) -> float:
    """Seconds of one block's non-GEMM part (:func:`non_gemm_step`), forward and backward, at
    (micro, seq), eager or compiled: the median of a few calls."""
    from runner.hardware.calibrate import timed  # deferred: torch, only for a plan that measures

    make = non_gemm_step(cfg, micro, seq, dtype=dtype, device=device, compiled=compiled)
    return timed(make(), device, repeats=5, warmup=3 if compiled else 2, beside=make, median=True)


def cross_entropy_seconds(tokens: int, vocab: int, *, dtype: Any, device: Any) -> float:
    """Seconds of the loss's forward and backward over (tokens, vocab) logits in ``dtype``:
    runner/model/transformer.py ``lm_loss`` itself (its fp32 cast, log-softmax, the gradient back)."""
    import torch  # deferred: only a plan that measures this host's device times the loss

    from runner.hardware.calibrate import timed
    from runner.model.transformer import lm_loss

    def make() -> Any:
        """Its logits and one forward + backward (each neighbour thread gets its own)."""
        logits = torch.randn(1, tokens, vocab, device=device, dtype=dtype, requires_grad=True)
        targets = torch.randint(0, vocab, (1, tokens), device=device)

        def step() -> None:
            lm_loss(logits, targets).backward()
            logits.grad = None

        return step

    return timed(make(), device, repeats=5, warmup=2, beside=make, median=True)


__all__ = ["block_seconds", "cross_entropy_seconds", "non_gemm_step", "rest_seconds"]
