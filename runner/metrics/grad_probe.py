"""Each micro-batch's own gradient norm, read as backward makes it, at any ZeRO stage.

The noise scale (runner/metrics/noise_scale.py) needs |G_small|², the squared norm of one
micro-batch's gradient, beside the step's. DeepSpeed reduces, partitions or
accumulates ``param.grad`` inside backward (ZeRO 1-3, and the all-reduce at stage 0),
so ``param.grad`` after backward is not one micro-batch's gradient. A tensor hook on
each parameter is: autograd calls it with the gradient of the backward in progress,
before it is accumulated into ``.grad`` and before DeepSpeed's post-accumulate hooks
reduce it (torch docs, "Backward Hooks execution"). Summing the squares there costs one
read of the gradients, no extra forward or backward pass.

Under tensor parallelism a rank holds a shard of most gradients and a replica of the
rest (runner/parallel/tensor.py): the squares of sharded parameters are kept apart, to be
summed over the tensor-parallel group, and a replica's counted once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import torch
from torch.utils.hooks import RemovableHandle

SHARDED, REPLICATED = 0, 1  # the two entries of the sums: tensor-parallel shards, whole tensors


class MicroGradSquares:
    """|g|² of each micro-batch's gradient on this rank: [sharded parameters, whole ones]."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        device: torch.device,
        is_sharded: Callable[[torch.nn.Parameter], bool] = lambda _: False,
    ) -> None:
        self._running = torch.zeros(2, dtype=torch.float32, device=device)  # this micro-batch so far
        self._total = torch.zeros(2, dtype=torch.float64, device=device)  # finished micro-batches
        self.micro_batches = 0
        self._handles: list[RemovableHandle] = [
            param.register_hook(functools.partial(self._add, SHARDED if is_sharded(param) else REPLICATED))
            for param in params
            if param.requires_grad
        ]

    def _add(self, slot: int, grad: torch.Tensor) -> None:
        # fp32 accumulation: a bf16 square rounds away small entries. The sum stays on
        # the device, so no hook waits for the device.
        self._running[slot] += torch.linalg.vector_norm(grad.detach(), dtype=torch.float32).square()

    def end_micro_batch(self, *, grad_scale: float) -> None:
        """Close one micro-batch; ``grad_scale`` undoes the loss scaling its backward saw."""
        self._total += self._running.double() * grad_scale**2
        self._running.zero_()
        self.micro_batches += 1

    def take_mean(self) -> torch.Tensor:
        """Mean |g|² over the micro-batches closed since the last call: a (2,) fp64 tensor,
        [SHARDED] over this rank's shards, [REPLICATED] over its whole tensors."""
        mean = self._total / max(self.micro_batches, 1)
        self._total = torch.zeros_like(self._total)
        self.micro_batches = 0
        return mean

    def remove(self) -> None:
        """Unhook from the parameters."""
        for handle in self._handles:
            handle.remove()
