"""FLOPs per token against a hand count of the tiny model, and MFU against PaLM's published figure."""

from __future__ import annotations

from typing import Any

import pytest

from runner.config import ModelConfig
from runner.flops import (
    flops_per_token,
    hfu,
    mfu,
    non_embedding_params,
    recompute_flops_per_token,
)
from runner.model.transformer import num_params

pytestmark = pytest.mark.unit

# conf/model/tiny.yaml: n_layer 4, d_model 256, n_head 4 (no GQA), ffn_hidden 688, vocab 256, tied.
TINY = ModelConfig()
SEQ = 128


def hand_count_per_token(*, causal: bool) -> float:
    """Matmul FLOPs per token of the tiny model, written out (a matmul (m x k)(k x n) is 2mkn FLOPs)."""
    L, h, f, V, s = TINY.n_layer, TINY.d_model, TINY.ffn_hidden, TINY.vocab_size, SEQ
    qkvo = 4 * 2 * h * h  # wq, wk, wv, wo: each (1 x h)(h x h) per token (n_kv_head = n_head)
    swiglu = 3 * 2 * h * f  # w1, w3: (1 x h)(h x f); w2: (1 x f)(f x h)
    # Scores q.K^T and the sum over V: per token, every head dots its query with each key
    # it sees (head size h/a, a heads: h per key) and sums that many value rows: 2h FLOPs
    # per key and matmul. Full square: s keys; causal: token t sees t + 1, (s + 1)/2 average.
    keys = (s + 1) / 2 if causal else s
    attention = 2 * (2 * h * keys)
    lm_head = 2 * h * V  # (1 x h)(h x V); the tied table does no other work (lookup)
    forward = L * (qkvo + swiglu + attention) + lm_head
    return 3 * forward  # backward: input grads + weight grads, each as costly as forward


def test_tiny_model_hand_count_vs_formula() -> None:
    """6N + 12Lhs vs the exact matmul count: they differ only by the norm gains in N.

    With N = all parameters (tied: the table counts once, as the output head), 6N also
    charges 6 FLOPs per token to each RMSNorm gain, (2L + 1)h of them, which are not
    matmuls. The full-square attention count equals 12Lhs exactly. Tolerance: that
    difference exactly, and under 0.1% of the total.
    """
    n = non_embedding_params(num_params(TINY), vocab_size=256, d_model=256, tie_embeddings=True)
    formula = flops_per_token(num_params=n, n_layers=4, d_model=256, seq_len=SEQ)
    hand = hand_count_per_token(causal=False)
    norm_gains = (2 * TINY.n_layer + 1) * TINY.d_model
    assert formula - hand == 6 * norm_gains
    assert formula == pytest.approx(hand, rel=1e-3)


def test_tiny_model_hand_count_vs_causal_formula() -> None:
    """causal=True: 6Lhs for the attention, vs the exact 6Lh(s + 1) (each token also sees itself)."""
    n = num_params(TINY)
    formula = flops_per_token(num_params=n, n_layers=4, d_model=256, seq_len=SEQ, causal=True)
    hand = hand_count_per_token(causal=True)
    norm_gains = (2 * TINY.n_layer + 1) * TINY.d_model
    diagonal = 6 * TINY.n_layer * TINY.d_model  # the +1 key per query the halving leaves out
    assert formula - hand == pytest.approx(6 * norm_gains - diagonal)
    assert formula == pytest.approx(hand, rel=1e-3)


def test_palm_540b_mfu_is_46_2_percent() -> None:
    """PaLM (arXiv 2204.02311) Table 3 / appendix B: 540B on 6144 TPU v4, 238.3K tokens/s -> 46.2% MFU.

    PaLM 540B: N = 540.35B, L = 118, 48 heads of size 256 (H*Q = 12288, the attention width
    that takes the place of d_model), T = 2048; TPU v4 peak 275 TFLOP/s (bf16).
    """
    per_token = flops_per_token(num_params=540_350_000_000, n_layers=118, d_model=48 * 256, seq_len=2048)
    achieved = mfu(
        tokens_per_s=238_300, flops_per_token=per_token, peak_flops_per_device=275e12, n_devices=6144
    )
    assert round(100 * achieved, 1) == 46.2


def test_non_embedding_params_for_untied_llama_7b() -> None:
    """Llama 2 7B (untied): 6,738,415,616 parameters minus the 32000 x 4096 input table."""
    assert non_embedding_params(6_738_415_616, vocab_size=32000, d_model=4096, tie_embeddings=False) == (
        6_738_415_616 - 131_072_000
    )
    assert non_embedding_params(1000, vocab_size=10, d_model=10, tie_embeddings=True) == 1000
    with pytest.raises(ValueError, match="exceeds"):
        non_embedding_params(10, vocab_size=10, d_model=10, tie_embeddings=False)


def test_recompute_flops() -> None:
    """Full recompute redoes the forward (a third of 6N + 12Lhs); attention only the attention core;
    op-level selective the three matmuls it does not keep (wk, wo, w3)."""
    args: dict[str, Any] = dict(num_params=10**9, n_layers=24, d_model=2048, seq_len=2048)
    per_token = flops_per_token(**args)
    assert recompute_flops_per_token(**args, recompute="full") == pytest.approx(per_token / 3)
    assert recompute_flops_per_token(**args, recompute="attention") == 4 * 24 * 2048 * 2048
    assert recompute_flops_per_token(**args, recompute="attention", causal=True) == 2 * 24 * 2048 * 2048
    shape = dict(kv_width=512, ffn_hidden=8192)
    assert recompute_flops_per_token(**args, recompute="selective", **shape) == 2 * 24 * 2048 * (
        512 + 2048 + 8192
    )
    with pytest.raises(ValueError, match="kv_width and ffn_hidden"):
        recompute_flops_per_token(**args, recompute="selective")
    assert recompute_flops_per_token(**args, recompute="none") == 0
    with pytest.raises(ValueError, match="recompute"):
        recompute_flops_per_token(**args, recompute="half")


def test_mfu_and_hfu() -> None:
    """MFU = tokens/s x FLOPs/token / (peak x devices); HFU adds the recomputed FLOPs."""
    assert mfu(tokens_per_s=1000, flops_per_token=1e9, peak_flops_per_device=1e12, n_devices=4) == 0.25
    full = hfu(
        tokens_per_s=1000,
        flops_per_token=1e9,
        recompute_flops_per_token=1e9 / 3,
        peak_flops_per_device=1e12,
        n_devices=4,
    )
    assert full == pytest.approx(0.25 * 4 / 3)
    with pytest.raises(ValueError, match="peak_flops_per_device"):
        mfu(tokens_per_s=1, flops_per_token=1, peak_flops_per_device=0, n_devices=1)


def test_causal_halves_only_the_attention_term() -> None:
    """causal=True removes 6Lhs, nothing from 6N."""
    full = flops_per_token(num_params=100, n_layers=2, d_model=8, seq_len=16)
    causal = flops_per_token(num_params=100, n_layers=2, d_model=8, seq_len=16, causal=True)
    assert full - causal == 6 * 2 * 8 * 16
