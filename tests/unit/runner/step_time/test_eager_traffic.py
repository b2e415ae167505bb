"""runner/step_time/eager_traffic.py: the bytes eager PyTorch's memory-bound kernels move, counted."""

from __future__ import annotations

import pytest

from runner.config import ModelConfig
from runner.step_time.eager_traffic import block_rest_traffic, loss_traffic
from runner.step_time.micro_batch_compute import BACKWARD_ELEMENTS, NORM_AND_RESIDUAL, ROPE, SWIGLU, TRANSPOSE

pytestmark = pytest.mark.unit

# llama_1b's block (Llama 3.2 1B): GQA, 4 query heads a key/value head.
BLOCK = ModelConfig(name="block", n_layer=1, n_head=32, n_kv_head=8, d_model=2048, ffn_hidden=8192)


def test_the_loss_moves_its_six_passes_over_the_logits():
    """lm_loss in bf16: the fp32 cast (2 B read, 4 written), log-softmax (4 + 4), the gradient of the
    gather written (4), log-softmax's backward (4 + 4 read, 4 written), the cast back (4 + 2): 36 B
    an element of the (tokens, vocab) logits; the gather itself reads one element a row."""
    tokens, vocab = 64, 1000
    moved, kernels = loss_traffic(tokens, vocab, "bfloat16")
    assert 36 * tokens * vocab <= moved < 36.1 * tokens * vocab
    assert kernels >= 5


def test_an_eager_block_in_bf16_moves_more_than_its_ops_tensors_once_in_bf16():
    micro, seq = 2, 256
    moved, kernels = block_rest_traffic(BLOCK, micro, seq, "bfloat16", 64)
    h, kv, f = 2048, 512, 8192
    once = micro * seq * (NORM_AND_RESIDUAL * h + ROPE * (h + kv) + TRANSPOSE * h + SWIGLU * f) * 2
    once *= 1 + BACKWARD_ELEMENTS
    assert 1.5 * once < moved < 2.5 * once  # RMSNorm's fp32 casts, RoPE's halves and cat, autograd's sums
    assert 80 <= kernels <= 150


def test_the_count_grows_with_the_tokens_and_the_dtype():
    one, _ = block_rest_traffic(BLOCK, 1, 256, "bfloat16", 64)
    four, _ = block_rest_traffic(BLOCK, 4, 256, "bfloat16", 64)
    fp32, _ = block_rest_traffic(BLOCK, 1, 256, "float32", 64)
    assert four == pytest.approx(4 * one, rel=0.01)
    assert one < fp32 < 2 * one  # RMSNorm and RoPE run in fp32 in either dtype


def test_a_tensor_parallel_rank_counts_its_own_heads_and_columns():
    whole, _ = block_rest_traffic(BLOCK, 1, 256, "bfloat16", 64)
    half = ModelConfig(name="block", n_layer=1, n_head=16, n_kv_head=4, d_model=2048, ffn_hidden=4096)
    rank, _ = block_rest_traffic(half, 1, 256, "bfloat16", 64)
    assert 0.5 * whole < rank < whole  # the norms and residuals stay at d_model on every rank
