"""The gradient norm DeepSpeed's FP16_UnfusedOptimizer clips by, under tensor or pipeline parallelism.

bf16 at ZeRO stage 0 without a pipeline, and fp16 at stage 0 with or without one (ladder
asks for torch's AdamW, not DeepSpeed's FusedAdam, so engine.py
``_configure_fp16_optimizer`` takes the unfused wrapper), is DeepSpeed's
FP16_UnfusedOptimizer (runtime/fp16/unfused_optimizer.py). Its step takes each group's
norm with ``get_weight_norm(grads, mpu=self.mpu)`` (runtime/utils.py), which asks the
gradient tensors, not their parameters, whether they are model-parallel, and on
model-parallel ranks > 0 drops every one:

- with AutoTP there is no mpu, so the norm is of this rank's shards alone: a bf16 ``ddp``
  run at tp 2 clipped by 13.6 where the model's gradient norm is 18.75 (tiny, step 0);
- under a pipeline the mpu is the grid, whose model-parallel group spans the stages:
  fp16 ``ddp`` at pp 2 clipped by 18.97 where the model's norm is 17.96 (tiny, step 0).

Either is another experiment than the same run on one rank. :func:`install` hands that
step the whole model's norm instead: runner/parallel/tensor.py ``params_grad_norm`` (each
shard's squares summed over the tensor-parallel group, a replicated weight counted once)
or, under a pipeline, ``grid_grad_norm`` (the stages' squares summed, the tied embedding
and the tensor-parallel group's replicated weights counted once).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from runner.engine.deepspeed_engine import DeepSpeedEngine, as_pipeline
from runner.parallel.tensor import grid_grad_norm, params_grad_norm


def install(engine: DeepSpeedEngine, *, tp: int, pp: int) -> bool:
    """Give this engine's FP16_UnfusedOptimizer the whole model's norm; whether it had one to mend."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.runtime.fp16 import unfused_optimizer

    if (tp, pp) == (1, 1) or not isinstance(engine.optimizer, unfused_optimizer.FP16_UnfusedOptimizer):
        return False
    module: torch.nn.Module = engine.module

    def weight_norm(grads: Iterable[torch.Tensor], norm_type: float = 2, mpu: Any = None) -> float:
        """The group's norm: its parameters found by their gradient tensors (the step passes those)."""
        held = {id(grad) for grad in grads}
        params = [p for p in module.parameters() if p.grad is not None and id(p.grad) in held]
        if pp > 1:
            return float(grid_grad_norm(params, as_pipeline(engine).grid))
        return params_grad_norm(params, tp=tp)

    # One engine per rank process: the step looks the function up in its module each call.
    unfused_optimizer.get_weight_norm = weight_norm  # type: ignore[assignment]
    return True


__all__ = ["install"]
