"""The gradient norm DeepSpeed's FP16_UnfusedOptimizer clips by, under tensor parallelism.

bf16 (and fp16) at ZeRO stage 0 without a pipeline is DeepSpeed's FP16_UnfusedOptimizer
(runtime/fp16/unfused_optimizer.py). Its step takes each group's norm with
``get_weight_norm(grads, mpu=self.mpu)`` (runtime/utils.py): with AutoTP there is no mpu,
so that is the norm of this rank's shards alone, and an mpu would not mend it (the function
asks the gradient tensors, not their parameters, whether they are model-parallel, and on
tensor-parallel ranks > 0 drops every one). A bf16 ``ddp`` run at tp 2 clipped by 13.6
where the model's gradient norm is 18.75 (tiny, step 0): another experiment than the
same run on one rank. :func:`install` hands that step the norm
runner/tensor_parallel.py computes instead: each sharded gradient's squares summed over the
tensor-parallel group, a replicated one's counted once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from runner.tensor_parallel import params_grad_norm


def install(engine: Any, *, tp: int) -> bool:
    """Give this engine's FP16_UnfusedOptimizer the tensor-parallel norm; whether it had one to mend."""
    from deepspeed.runtime.fp16 import unfused_optimizer

    if tp == 1 or not isinstance(engine.optimizer, unfused_optimizer.FP16_UnfusedOptimizer):
        return False
    module: torch.nn.Module = engine.module

    def weight_norm(grads: Iterable[torch.Tensor], norm_type: float = 2, mpu: Any = None) -> float:
        """The group's norm: its parameters found by their gradient tensors (the step passes those)."""
        held = {id(grad) for grad in grads}
        params = [p for p in module.parameters() if p.grad is not None and id(p.grad) in held]
        return params_grad_norm(params, tp=tp)

    # One engine per rank process: the step looks the function up in its module each call.
    unfused_optimizer.get_weight_norm = weight_norm  # type: ignore[assignment]
    return True


__all__ = ["install"]
