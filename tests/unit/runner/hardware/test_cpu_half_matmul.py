"""16-bit matmuls on a CPU without 16-bit GEMM kernels: fp32 arithmetic, one rounding, autograd untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runner.hardware import cpu_half_matmul
from runner.hardware.cpu_half_matmul import Fp32HalfMatmuls, computes_in_fp32, half_matmuls_in_fp32

pytestmark = pytest.mark.unit

HALF = [torch.bfloat16, torch.float16]


def _values(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_each_matmul_is_the_fp32_product_rounded_once(dtype):
    a, b = _values(48, 96, dtype=dtype, seed=0), _values(96, 64, dtype=dtype, seed=1)
    bias = _values(64, dtype=dtype, seed=2)
    batched_a, batched_b = _values(3, 16, 32, dtype=dtype, seed=3), _values(3, 32, 8, dtype=dtype, seed=4)
    batched_c = _values(3, 16, 8, dtype=dtype, seed=5)
    with Fp32HalfMatmuls():
        products = {
            "mm": a @ b,
            "addmm": torch.addmm(bias, a, b, beta=0.5, alpha=2.0),
            "linear": F.linear(a, b.T.contiguous(), bias),
            "bmm": torch.bmm(batched_a, batched_b),
            "baddbmm": torch.baddbmm(batched_c, batched_a, batched_b, beta=0.5, alpha=2.0),
        }
    a32, b32, bias32 = a.float(), b.float(), bias.float()
    ba32, bb32, bc32 = batched_a.float(), batched_b.float(), batched_c.float()
    expected = {
        "mm": a32 @ b32,
        "addmm": torch.addmm(bias32, a32, b32, beta=0.5, alpha=2.0),
        "linear": torch.addmm(bias32, a32, b32),
        "bmm": torch.bmm(ba32, bb32),
        "baddbmm": torch.baddbmm(bc32, ba32, bb32, beta=0.5, alpha=2.0),
    }
    for name, product in products.items():
        assert product.dtype == dtype, name
        assert torch.equal(product, expected[name].to(dtype)), name


def test_backward_gets_its_matmuls_in_fp32_and_saves_the_16_bit_tensors():
    """Autograd sits above the mode: the input and weight gradients are the fp32 products
    rounded once, and what the graph keeps for backward is what it keeps without the mode."""
    x = _values(32, 64, dtype=torch.bfloat16, seed=0).requires_grad_()
    weight = _values(48, 64, dtype=torch.bfloat16, seed=1).requires_grad_()
    grad_out = _values(32, 48, dtype=torch.bfloat16, seed=2)
    saved: dict[str, list[tuple[torch.dtype, int]]] = {"mode": [], "plain": []}

    def keeper(key: str):
        def keep(tensor: torch.Tensor) -> torch.Tensor:
            saved[key].append((tensor.dtype, tensor.nbytes))
            return tensor

        return keep

    with Fp32HalfMatmuls(), torch.autograd.graph.saved_tensors_hooks(keeper("mode"), lambda t: t):
        F.linear(x, weight).backward(grad_out)
    assert torch.equal(x.grad, (grad_out.float() @ weight.float()).bfloat16())
    assert torch.equal(weight.grad, (grad_out.float().T @ x.float()).bfloat16())
    with torch.autograd.graph.saved_tensors_hooks(keeper("plain"), lambda t: t):
        F.linear(x, weight)
    assert sorted(saved["mode"]) == sorted(saved["plain"])
    assert saved["mode"] and all(dtype == torch.bfloat16 for dtype, _ in saved["mode"])


def test_fp32_and_other_ops_pass_through_unchanged():
    a, b = _values(16, 16, dtype=torch.float32, seed=0), _values(16, 16, dtype=torch.float32, seed=1)
    half = _values(16, 16, dtype=torch.bfloat16, seed=2)
    with Fp32HalfMatmuls():
        product, summed, activated = a @ b, half + half, F.silu(half)
    assert torch.equal(product, a @ b)
    assert torch.equal(summed, half + half) and summed.dtype == torch.bfloat16
    assert torch.equal(activated, F.silu(half))


def test_the_mode_is_taken_only_where_torch_lacks_the_cpus_16_bit_kernels(monkeypatch):
    monkeypatch.setattr(cpu_half_matmul, "native_half_matmul", lambda dtype: False)
    assert computes_in_fp32(torch.bfloat16) and computes_in_fp32(torch.float16)
    assert not computes_in_fp32(torch.float32)
    assert not computes_in_fp32(torch.bfloat16, device_type="cuda")
    with half_matmuls_in_fp32(torch.bfloat16) as widened:
        assert widened
    monkeypatch.setattr(cpu_half_matmul, "native_half_matmul", lambda dtype: True)
    assert not computes_in_fp32(torch.bfloat16)
    with half_matmuls_in_fp32(torch.bfloat16) as widened:
        assert not widened


def test_fp32_is_always_native():
    assert cpu_half_matmul.native_half_matmul(torch.float32)
