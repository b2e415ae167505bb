"""The memory traffic of eager PyTorch's memory-bound kernels, counted on meta tensors.

Where a device's calibration has no timing of the block's non-GEMM part or of the loss
(a calibration file recorded without them), the step model prices them as bytes over the
device's copy bandwidth. Which bytes: eager PyTorch runs every op as a kernel of its own, each
reading its inputs and writing its output in full, fp32 casts and autograd's saved tensors and
gradient sums included, where a fused kernel (``torch.compile``) keeps such intermediates in
registers. This counts eager's: runner/step_time/measured/block_timing.py's non-GEMM part of the block and
runner/model/transformer.py ``lm_loss`` run forward and backward on the ``meta`` device (shapes
and dtypes, no data, no time) under a ``TorchDispatchMode`` that sees every aten op autograd
dispatches, and adds each op's input and output bytes. Views and allocations move no bytes and
are not counted; a broadcast input is read once (its stride-0 dimensions count 1); an input an
op reads only a few elements of (the loss's gather of each target's log-probability) or only
overwrites (``copy_``'s destination) is not counted as read.

llama_1b's block at micro 8 x seq 2048 in bf16 moves 19.0 GB this way in about 100 kernels,
against 10.7 GB for each op's tensors read and written once in bf16 (runner/step_time/micro_batch_compute.py
``NORM_AND_RESIDUAL`` ..., what the step model charges a compiled block): RMSNorm alone runs
its fp32 cast, square, mean, rsqrt, two multiplies and the cast back, and its backward as many
again.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from runner.config import ModelConfig

# aten ops that allocate or alias without reading or writing a tensor's elements.
_NO_TRAFFIC = frozenset(
    {
        "aten::_unsafe_view",
        "aten::detach",
        "aten::lift_fresh",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)


# aten op -> the positional arguments it does not read in full: nll_loss reads one log-probability
# a row (aten/src/ATen/native/LossNLL.cpp), its backward only the input's shape; copy_, fill_ and
# zero_ write their destination without reading it.
_NOT_READ = {
    "aten::nll_loss_forward": (0,),
    "aten::nll_loss_backward": (1,),
    "aten::copy_": (0,),
    "aten::fill_": (0,),
    "aten::zero_": (0,),
}


def _tensor_bytes(tensor: Any) -> int:
    """Bytes an op reads or writes of ``tensor``: its elements, a broadcast (stride 0) dim once."""
    elements = math.prod(size for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if stride)
    return elements * tensor.element_size()


def _counter() -> Any:
    """A dispatch mode that adds up every counted op's bytes and kernels."""
    import torch  # deferred: only a plan without the device's own timings counts
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Traffic(TorchDispatchMode):
        """Each aten op's input and output bytes, views and allocations aside."""

        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0
            self.kernels = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if getattr(func, "is_view", False) or func.name() in _NO_TRAFFIC:
                return out
            skipped = _NOT_READ.get(func.name(), ())
            read = [arg for index, arg in enumerate(args) if index not in skipped]
            tensors = [t for t in tree_flatten((read, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(_tensor_bytes(t) for t in tensors)
            self.kernels += 1
            return out

    return Traffic()


@functools.cache
def block_rest_traffic(
    cfg: ModelConfig, micro: int, seq: int, dtype_name: str, head_dim: int
) -> tuple[int, int]:
    """(bytes, kernels) of one block's non-GEMM part, forward and backward, run eagerly at
    (micro, seq) in ``dtype_name``: ``cfg``'s heads and widths as the rank holds them, each head
    ``head_dim`` wide."""
    import torch  # deferred: only a plan without the device's own timings counts

    from runner.step_time.measured.block_timing import non_gemm_step

    dtype, meta = getattr(torch, dtype_name), torch.device("meta")
    step = non_gemm_step(cfg, micro, seq, dtype=dtype, device=meta, head_dim=head_dim)()
    traffic = _counter()
    with traffic:
        step()
    return traffic.bytes, traffic.kernels


@functools.cache
def loss_traffic(tokens: int, vocab: int, dtype_name: str) -> tuple[int, int]:
    """(bytes, kernels) of ``lm_loss`` forward and backward over (tokens, vocab) logits."""
    import torch  # deferred: only a plan without the device's own timings counts

    from runner.model.transformer import lm_loss

    meta = torch.device("meta")
    logits = torch.empty(1, tokens, vocab, device=meta, dtype=getattr(torch, dtype_name), requires_grad=True)
    targets = torch.empty(1, tokens, device=meta, dtype=torch.long)
    traffic = _counter()
    with traffic:
        lm_loss(logits, targets).backward()
    return traffic.bytes, traffic.kernels


__all__ = ["block_rest_traffic", "loss_traffic"]
