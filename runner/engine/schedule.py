"""Learning rate: the scaling rule for a global batch off its reference, then warmup and decay."""

from __future__ import annotations

import math

from runner.config import LrScaling, OptimizerConfig, Schedule


def scaled_lr(optimizer: OptimizerConfig, *, global_size: int) -> float:
    """The peak learning rate for ``global_size``, scaled from ``optimizer.reference_batch``.

    linear: lr * B / B_ref (Goyal et al. 2017, "Accurate, Large Minibatch SGD", Sec. 2.1);
    sqrt: lr * sqrt(B / B_ref) (Krizhevsky 2014, "One weird trick", Sec. 5; the rule
    that keeps the variance of the update fixed). With no reference, or rule ``none``,
    the configured rate is used as is.
    """
    reference = optimizer.reference_batch
    if optimizer.lr_scaling == LrScaling.none or reference is None:
        return optimizer.lr
    ratio = global_size / reference
    if optimizer.lr_scaling == LrScaling.linear:
        return optimizer.lr * ratio
    return optimizer.lr * math.sqrt(ratio)


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: Schedule, min_lr_ratio: float
) -> float:
    """Factor on the peak rate at optimizer step ``step`` (0-based): linear warmup, then the schedule."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == Schedule.constant:
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps - 1)  # the last step lands on min_lr_ratio
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    # Cosine decay from 1 to min_lr_ratio (Loshchilov & Hutter 2017, SGDR, eq. 5, one cycle).
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
