"""ZeRO's lean step takes each gradient's norm in fp64 without a whole fp64 copy of it
(runner/engine/lean_zero_step.py ``norm_in_fp64``); the step itself is compared with DeepSpeed's
in tests/multirank/test_lean_zero_step.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_a_gradients_norm_in_chunks_is_deepspeeds_fp64_norm():
    """The norm DeepSpeed takes of each gradient cast whole to fp64, here without the copy: a
    bf16 gradient of several chunks, and one smaller than a chunk."""
    import torch

    from runner.engine.lean_zero_step import NORM_CHUNK, norm_in_fp64

    torch.manual_seed(0)
    for numel in (3 * NORM_CHUNK + 12345, 1000):
        grad = torch.randn(numel).mul(1e-3).bfloat16()
        deepspeeds = torch.linalg.vector_norm(grad.to(torch.float64))
        ours = norm_in_fp64(grad)
        assert ours.dtype == torch.float64
        assert float(abs(ours - deepspeeds) / deepspeeds) < 1e-12
