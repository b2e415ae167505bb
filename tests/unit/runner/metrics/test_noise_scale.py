"""The gradient noise scale estimator against a problem whose noise scale is known in closed form."""

from __future__ import annotations

import math

import pytest
import torch

from runner.metrics.grad_probe import MicroGradSquares
from runner.metrics.noise_scale import NoiseScale, gradient_estimates, squared_l2_norm, why_unmeasured

pytestmark = pytest.mark.unit


def _linear_regression_gradients(
    *, steps: int, n_small: int, b_small: int, delta: torch.Tensor, sigma: float, seed: int
) -> torch.Tensor:
    """Per-small-batch gradients, shape (steps, n_small, d), of the mean squared loss ½(x·w − y)².

    x ~ N(0, I_d), y = x·w* + ε with ε ~ N(0, σ²), evaluated at w = w* + δ. Each small batch
    has its own copy of w, so one backward gives every small batch's own gradient.
    """
    generator = torch.Generator().manual_seed(seed)
    d = delta.numel()
    w_star = torch.randn(d, generator=generator, dtype=torch.float64)
    x = torch.randn(steps, n_small, b_small, d, generator=generator, dtype=torch.float64)
    noise = sigma * torch.randn(steps, n_small, b_small, generator=generator, dtype=torch.float64)
    y = x @ w_star + noise  # (steps, n_small, b_small)
    w = (w_star + delta).expand(steps, n_small, d).clone().requires_grad_(True)
    pred = torch.einsum("tkbd,tkd->tkb", x, w)
    loss_per_small_batch = 0.5 * (pred - y).square().mean(dim=-1)  # (steps, n_small)
    loss_per_small_batch.sum().backward()
    assert w.grad is not None
    return w.grad


def test_recovers_closed_form_noise_scale_of_linear_regression() -> None:
    # Closed form. Per-example gradient g = x(x·δ − ε), so G = E[g] = E[xxᵀ]δ = δ and, by
    # Isserlis' theorem for Gaussian x, E[ggᵀ] = |δ|²I + 2δδᵀ + σ²I. Hence
    #   Σ = E[ggᵀ] − GGᵀ = (|δ|² + σ²) I + δδᵀ,   tr(Σ) = d(|δ|² + σ²) + |δ|²,   |G|² = |δ|²,
    #   B_simple = tr(Σ)/|G|² = d + 1 + dσ²/|δ|²  (McCandlish et al. 2018, eq. 2.8).
    d, sigma = 8, 1.0
    delta = torch.full((d,), 1.0 / math.sqrt(d), dtype=torch.float64)  # |δ|² = 1
    trace_sigma = d * (1.0 + sigma**2) + 1.0
    expected = trace_sigma / 1.0  # 17 examples
    # Runner-like shape: small batch = one micro-batch of 4, big batch = the 16 micro-batches' mean.
    steps, n_small, b_small = 3000, 16, 4
    b_big = n_small * b_small
    grads = _linear_regression_gradients(
        steps=steps, n_small=n_small, b_small=b_small, delta=delta, sigma=sigma, seed=0
    )
    small_sq = grads.square().sum(-1).mean(-1)  # mean over small batches of |G_small|², (steps,)
    big_sq = grads.mean(1).square().sum(-1)  # |G_big|² of the big batch's mean-loss gradient, (steps,)

    ema = 0.999
    estimator = NoiseScale(ema=ema)
    for t in range(steps):
        answer = estimator.update(
            small_sq_norm=float(small_sq[t]),
            small_batch=b_small,
            big_sq_norm=float(big_sq[t]),
            big_batch=b_big,
        )
    assert answer is not None and answer == estimator.value

    # Tolerance from the sample size. The answer is a ratio of EMA-weighted means of the
    # independent per-step estimates (S_t, G_t) with weights w_t ∝ ema^(T−1−t); its delta-method
    # standard error is sqrt(Σ w_t² (S_t − R G_t)²) / Σ w_t G_t, i.e. the per-step spread over
    # sqrt(n_eff), n_eff = (Σw)²/Σw² ≈ (1 + ema)/(1 − ema) ≈ 1.6e3 here. Four standard errors.
    per_step = [
        gradient_estimates(small_sq_norm=float(s), small_batch=b_small, big_sq_norm=float(b), big_batch=b_big)
        for s, b in zip(small_sq, big_sq, strict=True)
    ]
    g_t = torch.tensor([g for g, _ in per_step], dtype=torch.float64)
    s_t = torch.tensor([s for _, s in per_step], dtype=torch.float64)
    weights = ema ** torch.arange(steps - 1, -1, -1, dtype=torch.float64)
    n_eff = float(weights.sum() ** 2 / weights.square().sum())
    assert n_eff > 1000
    std_err = float((weights.square() * (s_t - answer * g_t).square()).sum().sqrt() / (weights * g_t).sum())
    assert std_err < 0.05 * expected  # the check can tell a wrong formula from noise
    assert abs(answer - expected) < 4 * std_err, (answer, expected, std_err)


def test_exact_expectations_give_exact_answer() -> None:
    # E|G_B|² = |G|² + tr(Σ)/B (McCandlish et al. eq. A.1): feeding the expectations recovers both terms.
    grad_sq, trace_sigma = 2.0, 30.0
    estimator = NoiseScale(ema=0.5)
    for _ in range(3):
        value = estimator.update(
            small_sq_norm=grad_sq + trace_sigma / 4,
            small_batch=4,
            big_sq_norm=grad_sq + trace_sigma / 64,
            big_batch=64,
        )
    assert value == pytest.approx(trace_sigma / grad_sq)
    summary = estimator.summary(seq_len=128)
    assert summary["simple_tokens"] == pytest.approx(15.0 * 128)
    assert (summary["small_batch"], summary["big_batch"], summary["updates"]) == (4, 64, 3)


def test_smooths_numerator_and_denominator_not_the_ratio() -> None:
    estimator = NoiseScale(ema=0.5)
    # Step 1: |G|² = 1, S = 10 (ratio 10). Step 2: |G|² = 4, S = 8 (ratio 2).
    for grad_sq, trace_sigma in ((1.0, 10.0), (4.0, 8.0)):
        estimator.update(
            small_sq_norm=grad_sq + trace_sigma / 2,
            small_batch=2,
            big_sq_norm=grad_sq + trace_sigma / 8,
            big_batch=8,
        )
    # EMAs from zero: |G|² → 0.5·(0.5·1) + 0.5·4 = 2.25, S → 0.5·(0.5·10) + 0.5·8 = 6.5.
    assert estimator.value == pytest.approx(6.5 / 2.25)
    assert estimator.value != pytest.approx(0.5 * (0.5 * 10) + 0.5 * 2)  # an EMA of the ratios


def test_a_restored_state_goes_on_as_if_never_stopped() -> None:
    """A resumed run takes up the checkpoint's EMAs (runner/checkpoint/save.py's latest.json)."""
    steps = [(5.0, 4, 2.0, 16), (4.0, 4, 1.5, 16), (6.0, 2, 1.0, 16), (3.0, 2, 1.2, 16)]

    def fold(noise: NoiseScale, part: list[tuple[float, int, float, int]]) -> float | None:
        value = None
        for small, b_small, big, b_big in part:
            value = noise.update(small_sq_norm=small, small_batch=b_small, big_sq_norm=big, big_batch=b_big)
        return value

    uninterrupted = fold(NoiseScale(ema=0.9), steps)
    before = NoiseScale(ema=0.9)
    fold(before, steps[:2])
    after = NoiseScale(ema=0.9)
    after.restore(before.state())
    assert fold(after, steps[2:]) == uninterrupted  # micro 4 before, 2 after: another layout
    assert after.updates == 4


def test_a_state_saved_not_finite_starts_afresh() -> None:
    """latest.json holds a non-finite EMA as null (an fp16 overflow once folded in): the resumed
    run measures anew instead of failing to start."""
    noise = NoiseScale()
    noise.restore({"updates": 3, "grad_sq": None, "trace_sigma": None})
    assert (noise.updates, noise.value) == (0, None)
    assert noise.update(small_sq_norm=5.0, small_batch=4, big_sq_norm=2.0, big_batch=16) is not None


def test_none_until_gradient_estimate_positive() -> None:
    estimator = NoiseScale()
    assert estimator.value is None
    # |G_big|² far below |G_small|²/16: the |G|² estimate (16·0.1 − 4·1)/12 is negative.
    assert estimator.update(small_sq_norm=1.0, small_batch=4, big_sq_norm=0.1, big_batch=16) is None
    assert estimator.summary(seq_len=8)["simple_tokens"] is None


def test_undefined_when_global_equals_micro() -> None:
    with pytest.raises(ValueError, match="global_size == micro_size"):
        NoiseScale().update(small_sq_norm=1.0, small_batch=8, big_sq_norm=1.0, big_batch=8)
    with pytest.raises(ValueError, match="ema"):
        NoiseScale(ema=1.0)


def test_why_unmeasured_names_the_fix() -> None:
    assert why_unmeasured(gradients_per_step=2) is None
    reason = why_unmeasured(gradients_per_step=1)
    assert reason is not None and "batch.micro_size" in reason
    reason = why_unmeasured(gradients_per_step=4, pp=2, tied_embeddings=True)
    assert reason is not None and "model.tie_embeddings=false" in reason
    assert why_unmeasured(gradients_per_step=4, pp=2) is None  # untied: the stages' squares add up


def test_probe_reads_each_micro_batch_gradient_not_the_accumulated_one() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    batches = [torch.randn(4, 6) for _ in range(3)]
    expected = []
    for x in batches:  # each micro-batch's own gradient, computed alone
        grads = torch.autograd.grad(model(x).square().mean(), list(model.parameters()))
        expected.append(sum(float(g.square().sum()) for g in grads))
    first = model[0].weight  # counted apart, as a tensor-parallel shard would be
    probe = MicroGradSquares(model.parameters(), torch.device("cpu"), is_sharded=lambda p: p is first)
    for x in batches:  # accumulated into .grad as a training loop does, loss / accum
        (model(x).square().mean() / len(batches)).backward()
        probe.end_micro_batch(grad_scale=len(batches))
    sharded, whole = probe.take_mean().tolist()
    assert sharded + whole == pytest.approx(sum(expected) / len(expected), rel=1e-5)
    assert 0 < sharded < sharded + whole
    assert probe.micro_batches == 0 and float(probe.take_mean().sum()) == 0.0
    probe.remove()


def test_squared_l2_norm_accumulates_in_fp32() -> None:
    # 300² = 9e4 overflows fp16 (max 65504); the fp32 accumulation does not.
    grads = [torch.full((4,), 300.0, dtype=torch.float16), torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)]
    assert squared_l2_norm(grads) == pytest.approx(4 * 300.0**2 + 5.0, rel=1e-6)
    assert squared_l2_norm([]) == 0.0
