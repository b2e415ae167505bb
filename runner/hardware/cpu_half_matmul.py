"""16-bit matmuls on a CPU without 16-bit GEMM kernels: computed in fp32, rounded once to 16 bits.

Where oneDNN has no bf16 kernels for the CPU (x86 without AVX-512), or no fp16 ones (without
AVX512-FP16 or AMX-FP16), torch runs bf16 and fp16 matmuls on its reference kernel
(aten/src/ATen/native/cpu/BlasKernel.cpp), single-threaded and unblocked: on a 2-core AVX2
EPYC, a (256, 1024) @ (1024, 1024) bf16 matmul ran at 0.8 GFLOP/s against fp32's 59, and
pytorch/pytorch#146508 reports 45x to 500x on other AVX2 hosts. A rank on such a CPU therefore
computes those matmuls in fp32 from the exact 16-bit values (bf16 and fp16 widen to fp32
without loss) and rounds each result once to its 16-bit dtype: what a GPU's tensor cores do
(fp32 accumulation, one rounding of the output), and what the reference kernel approximates.

The switch is a TorchDispatchMode, below autograd: ``F.linear``, ``torch.matmul`` and every
backward reach it as ``mm``, ``addmm``, ``bmm`` or ``baddbmm``. What autograd saves for backward
is untouched (the 16-bit tensors), so the ledger's activations are the same; the fp32 copies
live only while their matmul runs. torch.compile does not trace under a Python dispatch mode
(it runs the function eagerly), so a compiled run keeps torch's own kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

HALF_DTYPES = (torch.bfloat16, torch.float16)
# torch's own question for each dtype: does oneDNN have GEMM kernels for it on this CPU?
_ONEDNN_SUPPORTS = {
    torch.bfloat16: "_is_mkldnn_bf16_supported",
    torch.float16: "_is_mkldnn_fp16_supported",
}
# The matmuls the others reduce to on CPU, and which argument carries the operands' dtype.
_MATMULS = {
    aten.mm.default: 0,  # mm(self, mat2)
    aten.bmm.default: 0,  # bmm(self, mat2)
    aten.addmm.default: 1,  # addmm(bias, mat1, mat2, *, beta, alpha)
    aten.baddbmm.default: 1,  # baddbmm(self, batch1, batch2, *, beta, alpha)
}


def native_half_matmul(dtype: torch.dtype) -> bool:
    """Whether torch multiplies ``dtype`` matrices on this CPU with oneDNN, not its reference kernel."""
    question = _ONEDNN_SUPPORTS.get(dtype)
    if question is None:
        return True  # fp32: MKL or oneDNN everywhere
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    try:
        return bool(getattr(torch.ops.mkldnn, question)())
    except (AttributeError, RuntimeError):  # a torch that cannot say: its kernels as they are
        return True


def computes_in_fp32(dtype: torch.dtype, *, device_type: str = "cpu") -> bool:
    """Whether a rank on ``device_type`` computes its ``dtype`` matmuls in fp32 (this module)."""
    return device_type == "cpu" and dtype in HALF_DTYPES and not native_half_matmul(dtype)


class Fp32HalfMatmuls(TorchDispatchMode):
    """CPU bf16/fp16 ``mm``, ``addmm``, ``bmm`` and ``baddbmm`` in fp32, each result rounded to its dtype."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        operand = _MATMULS.get(func)
        if operand is not None:
            dtype = args[operand].dtype
            if dtype in HALF_DTYPES and args[operand].device.type == "cpu":
                wide = [arg.float() if isinstance(arg, torch.Tensor) else arg for arg in args]
                return func(*wide, **kwargs).to(dtype)
        return func(*args, **kwargs)


@contextlib.contextmanager
def half_matmuls_in_fp32(dtype: torch.dtype, *, device_type: str = "cpu") -> Iterator[bool]:
    """Within: ``dtype`` matmuls in fp32 where ``computes_in_fp32`` says so; yields whether they are."""
    if not computes_in_fp32(dtype, device_type=device_type):
        yield False
        return
    with Fp32HalfMatmuls():
        yield True
