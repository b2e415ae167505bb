"""Undo the optimizer step DeepSpeed's 16-bit stage-0 wrappers take at construction.

DeepSpeed 0.19.8's ``FP16_UnfusedOptimizer`` (bf16 at ZeRO stage 0, ``parallel=ddp``:
engine.py ``_do_optimizer_sanity_check`` returns DDP_BFLOAT16) and ``FP16_Optimizer``
(fp16 with a fused optimizer) call ``initialize_optimizer_states`` in ``__init__``: one
``optimizer.step()`` on zero gradients, so that Adam's state exists before the first
save. For AdamW that step is not empty:

- Adam's step count becomes 1, so the first real update uses the bias corrections of
  t = 2 (Kingma & Ba 2015, arXiv 1412.6980, Algorithm 1): its size is
  ``(1 - b1) / (1 - b1^2) / sqrt((1 - b2) / (1 - b2^2))`` of the t = 1 update, 0.735 for
  betas (0.9, 0.95);
- decoupled weight decay (Loshchilov & Hutter 2019, arXiv 1711.05101) shrinks every
  decayed master weight by ``lr * weight_decay``, at the optimizer's initial lr.

Measured on tiny, bf16, 1 rank, lr 1e-3: ``parallel=ddp``'s loss after one step was 0.087
above ZeRO-1's (4.897 against 4.810; fp32 4.816). ZeRO 1-3 and DeepSpeed's BF16_Optimizer
take no such step. :func:`undo_prestep` puts the state back where Adam starts (step 0,
moments already zero) and the master weights back to the 16-bit weights they were copied
from, so every layout starts the same experiment.
"""

from __future__ import annotations

from typing import Any

import torch


def undo_prestep(optimizer: Any) -> bool:
    """Reset the wrapper's construction step in place; False when ``optimizer`` took none."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    with torch.no_grad():
        if isinstance(optimizer, FP16_UnfusedOptimizer):
            for masters, weights in zip(optimizer.fp32_groups, optimizer.fp16_groups, strict=True):
                for master, weight in zip(masters, weights, strict=True):
                    master.copy_(weight)
        elif isinstance(optimizer, FP16_Optimizer):
            for master, flat in zip(optimizer.fp32_groups_flat, optimizer.fp16_groups_flat, strict=True):
                master.copy_(flat)
        else:
            return False
        # In place: the moments stay allocated (the memory ledger measures them from the start).
        for state in optimizer.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value):
                    value.zero_()
                elif key == "step":  # a plain number in torch's non-capturable, non-fused paths
                    state[key] = type(value)(0)
    return True
