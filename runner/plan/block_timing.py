"""One transformer block, timed as the run will run it: the in-place check on the step model's parts.

The step model (runner/plan/step_model.py) adds a block's GEMMs, attention, memory-bound
kernels and op dispatch from separate micro-benchmarks. Run back to back inside a real block,
those kernels are slower than alone: on a 2-core CPU the block's GEMMs ran about 17% below
their measured rate (llama-style gpt2_124m shape, micro 2, seq 128, profiled), as each
kernel starts on data the one before left in another core's cache. This measures the real
thing: ``runner.model.transformer.TransformerBlock`` at the run's width, micro-batch and
sequence, forward then backward, in the run's dtype; the step model scales the block's parts
by the ratio of this time to their sum.
"""

from __future__ import annotations

from typing import Any

from runner.config import ModelConfig, Recompute


def block_seconds(cfg: ModelConfig, micro: int, seq: int, *, dtype: Any, device: Any) -> float:
    """Seconds of one block's forward and backward at (micro, seq), the fastest of a few."""
    import dataclasses

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

    return timed(block_step(), device, repeats=5, warmup=2, beside=block_step)


__all__ = ["block_seconds"]
