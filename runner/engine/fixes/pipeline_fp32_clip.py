"""fp32 ZeRO-0 under a pipeline clips by the norm of every stage's gradients, not the first's.

DeepSpeed 0.19 clips fp32 ZeRO-0 gradients with runtime/utils.py ``clip_grad_norm_``,
whose Megatron rule counts a non-model-parallel parameter on model-parallel rank 0
only; the pipeline grid's model-parallel group spans the stages, so only the first
stage's gradients enter the norm. Here each stage adds its own squared norm over the
pipeline group, after the data-parallel all-reduce, as the plain layout sees it
(runner/parallel/tensor.py ``grid_grad_norm``, tensor-parallel shards included).
"""

from __future__ import annotations

import torch

from runner.config import Precision
from runner.engine.deepspeed_engine import DeepSpeedEngine, as_pipeline
from runner.parallel.tensor import grid_grad_norm


def install(engine: DeepSpeedEngine, *, pp: int, precision: Precision, grad_clip: float) -> bool:
    """Give a pipeline engine's fp32 stage-0 clipping the whole model's norm; whether it applied."""
    if pp == 1 or engine.zero_optimization() or precision != Precision.fp32 or grad_clip <= 0:
        return False
    pipeline = as_pipeline(engine)

    def clip() -> None:
        grads = {p: p.grad for p in pipeline.module.parameters() if p.grad is not None}
        norm = grid_grad_norm(list(grads), pipeline.grid)
        coef = torch.clamp(grad_clip / (norm + 1e-6), max=1.0)  # as clip_grad_norm_ does
        for grad in grads.values():
            grad.mul_(coef)
        pipeline._global_grad_norm = float(norm)

    pipeline.clip_fp32_gradients = clip
    return True
