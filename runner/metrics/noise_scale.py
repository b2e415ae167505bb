"""Gradient noise scale: the batch size past which a bigger batch stops buying fewer steps.

The simple noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training", eq. 2.8) is

    B_simple = tr(Σ) / |G|²

with G the true gradient and Σ the per-example gradient covariance. It is measured
from two gradients the step computes anyway (appendix A.1): a mini-batch gradient
G_B over B examples has E|G_B|² = |G|² + tr(Σ)/B (eq. A.1), so squared norms at two
batch sizes B_small < B_big give unbiased estimates of both terms (eq. A.2):

    |G|² ≈ (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small)
    S    ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)        (S estimates tr(Σ))

Each is noisy per step (either can come out negative), and a ratio of unbiased
estimates is biased, so the paper averages numerator and denominator separately over
steps and reports the ratio of the averages; :class:`NoiseScale` does that with EMAs.

In the runner the small batch is one micro-batch (B_small = micro_size sequences: the
gradient of its mean loss, read by parameter hooks during backward, runner/metrics/grad_probe.py,
its square averaged over the micro-batches and the dp ranks) and the big batch is the
optimizer step's reduced gradient (B_big = global_size).
Units are those of the batch sizes passed in: sequences here; multiply by seq_len for
tokens. Undefined when global_size == micro_size (one micro-batch per step on one
rank: both gradients are the same batch); ``batch.micro_size=auto`` avoids that.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from runner.rundir.checkpoint_record import NoiseScaleState
from runner.rundir.summary_records import NoiseScaleRecord


def squared_l2_norm(grads: Iterable[torch.Tensor]) -> float:
    """Sum of squared entries over all tensors, accumulated in fp32 whatever their dtype."""
    # Per-tensor norms in fp32 (an fp16/bf16 square would overflow or round away), then one sum.
    norms = [torch.linalg.vector_norm(grad.detach(), dtype=torch.float32) for grad in grads]
    if not norms:
        return 0.0
    return float(torch.stack(norms).square().sum())


def why_unmeasured(*, gradients_per_step: int, pp: int = 1, tied_embeddings: bool = False) -> str | None:
    """Why a step holds no small-batch gradient to compare with its own, or None when it does.

    Tensor and pipeline parallelism are measured: each micro-batch's squared norms are
    summed over the shards of the tensor-parallel group, or over the stages of the pipeline
    (runner/metrics/step_probes.py), except for a tied embedding split between two stages.
    """
    if pp > 1 and tied_embeddings:
        return (
            "not measured with pipeline parallelism and tied embeddings: the first and last "
            "stages each hold part of the tied weight's gradient, and the squares of two parts "
            "are not the square of their sum; set model.tie_embeddings=false to measure it"
        )
    if gradients_per_step < 2:
        return (
            "needs two gradients per step (accum_steps x dp >= 2): with one micro-batch on one "
            "rank global_size == micro_size and B_simple is undefined; lower batch.micro_size"
        )
    return None


def gradient_estimates(
    *, small_sq_norm: float, small_batch: int, big_sq_norm: float, big_batch: int
) -> tuple[float, float]:
    """One step's unbiased (|G|², tr(Σ)) estimates from two batch sizes (McCandlish et al. eq. A.2)."""
    if small_batch < 1 or big_batch <= small_batch:
        raise ValueError(
            f"the noise scale needs 1 <= small_batch < big_batch, got small_batch={small_batch}, "
            f"big_batch={big_batch} (undefined when global_size == micro_size)"
        )
    grad_sq = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)
    trace_sigma = (small_sq_norm - big_sq_norm) / (1.0 / small_batch - 1.0 / big_batch)
    return grad_sq, trace_sigma


class NoiseScale:
    """B_simple = EMA(tr(Σ) estimate) / EMA(|G|² estimate), in the units of the batch sizes given.

    Both EMAs start at zero and take the same weights, so Adam-style bias correction
    would divide both by the same factor and leave the ratio unchanged; none is applied.
    """

    def __init__(self, ema: float = 0.95) -> None:
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"ema={ema}: the smoothing factor must be in [0, 1)")
        self.ema = ema
        self.updates = 0
        self.small_batch: int | None = None  # batch sizes of the latest update
        self.big_batch: int | None = None
        self._grad_sq = 0.0  # EMA of the |G|² estimates
        self._trace_sigma = 0.0  # EMA of the tr(Σ) estimates

    def update(
        self, *, small_sq_norm: float, small_batch: int, big_sq_norm: float, big_batch: int
    ) -> float | None:
        """Fold one step's squared norms in; return the smoothed B_simple (None while undefined)."""
        grad_sq, trace_sigma = gradient_estimates(
            small_sq_norm=small_sq_norm,
            small_batch=small_batch,
            big_sq_norm=big_sq_norm,
            big_batch=big_batch,
        )
        self._grad_sq = self.ema * self._grad_sq + (1.0 - self.ema) * grad_sq
        self._trace_sigma = self.ema * self._trace_sigma + (1.0 - self.ema) * trace_sigma
        self.updates += 1
        self.small_batch, self.big_batch = small_batch, big_batch
        return self.value

    def state(self) -> NoiseScaleState:
        """The EMAs and their count, for a checkpoint: a resumed run goes on smoothing where it stopped.

        Both estimates are unbiased whatever the batch sizes (eq. A.2), so they carry over
        to a resume on another layout, whose micro-batch may differ.
        """
        return {"updates": self.updates, "grad_sq": self._grad_sq, "trace_sigma": self._trace_sigma}

    def restore(self, state: NoiseScaleState) -> None:
        """Take up the EMAs ``state`` recorded (same ``ema``).

        An EMA saved as null was not finite (an fp16 overflow's infinite norm folded in, before
        runner/metrics/step_probes.py left such steps out): the EMAs start afresh instead.
        """
        grad_sq, trace_sigma = state.get("grad_sq"), state.get("trace_sigma")
        if grad_sq is None or trace_sigma is None:
            return
        self.updates = int(state["updates"])
        self._grad_sq = float(grad_sq)
        self._trace_sigma = float(trace_sigma)

    @property
    def value(self) -> float | None:
        """The smoothed B_simple; None before any update or while the |G|² average is not positive."""
        if self.updates == 0 or self._grad_sq <= 0.0:
            return None
        return self._trace_sigma / self._grad_sq

    def summary(self, *, seq_len: int, unmeasured: str | None = None) -> NoiseScaleRecord:
        """What summary.json keeps: the latest B_simple in sequences and tokens, and how it was measured."""
        value = self.value
        return {
            "simple": value,
            "simple_tokens": value * seq_len if value is not None else None,
            "unit": "sequences (simple_tokens = simple x seq_len)",
            "small_batch": self.small_batch,
            "big_batch": self.big_batch,
            "ema": self.ema,
            "updates": self.updates,
            "unmeasured": unmeasured,
            "source": "McCandlish et al. 2018, eq. 2.8 and A.2; EMAs of numerator and denominator",
        }
