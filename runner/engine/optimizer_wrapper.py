"""Which optimizer wrapper DeepSpeed 0.19.8 puts around a layout's optimizer, from the layout alone.

The wrapper decides what a rank holds beside the model states (a flat gradient buffer, fp32
masters), what a checkpoint saves and how it loads, and whether DeepSpeed reports a gradient
norm. The memory model, the checkpoint code and the trainer ask :func:`optimizer_wrapper`
rather than working it out from the precision, the stage and the pipeline each time; no engine
is built, so the plan asks it too.

DeepSpeed chooses in deepspeed/runtime/engine.py ``DeepSpeedEngine._configure_optimizer``, on
what ``_do_optimizer_sanity_check`` returns:

=========  =====  ===  ===================================  =============================
precision  stage  pp   sanity check returns                 wrapper
=========  =====  ===  ===================================  =============================
fp32       0      any  None                                 none: torch's optimizer steps
bf16       0      1    DDP_BFLOAT16                         FP16_UnfusedOptimizer
bf16       0      > 1  BFLOAT16 (``pipeline_parallelism``)  BF16_Optimizer
fp16       0      any  FP16                                 FP16_UnfusedOptimizer
any        1-2    any  ZERO_OPTIMIZATION                    DeepSpeedZeroOptimizer
any        3      any  ZERO_OPTIMIZATION                    DeepSpeedZeroOptimizer_Stage3
=========  =====  ===  ===================================  =============================

Two of DeepSpeed's branches no ladder layout takes, as runner/engine/deepspeed_config.py writes
DeepSpeed's config: FP16 and DDP_BFLOAT16 give ``FP16_Optimizer`` only around DeepSpeed's
FusedAdam (engine.py ``_configure_fp16_optimizer``), and ladder's stage-0 optimizer is torch's
(``torch_adam``, or SGD); ZeRO-1 in bf16 gives ``BF16_Optimizer`` only with fp32 gradient
accumulation (``data_types.grad_accum_dtype``), which ladder leaves at the model's dtype.
``pipeline_parallelism`` is whether the model is a ``PipelineModule``, which ladder builds
where pp > 1 (runner/model/build_method.py ``BY_STAGE``).
"""

from __future__ import annotations

from enum import Enum

from runner.config_choices import Precision, ZeroStage


class OptimizerWrapper(str, Enum):
    """DeepSpeed 0.19.8's wrappers around the basic optimizer; each value is the class's name."""

    none = "none"  # the basic optimizer (torch's) steps the parameters itself
    fp16_optimizer = "FP16_Optimizer"  # runtime/fp16/fused_optimizer.py; no ladder layout (above)
    fp16_unfused_optimizer = "FP16_UnfusedOptimizer"  # runtime/fp16/unfused_optimizer.py
    bf16_optimizer = "BF16_Optimizer"  # runtime/bf16_optimizer.py
    zero_optimizer = "DeepSpeedZeroOptimizer"  # runtime/zero/stage_1_and_2.py
    zero3_optimizer = "DeepSpeedZeroOptimizer_Stage3"  # runtime/zero/stage3.py


def optimizer_wrapper(
    *, precision: Precision | str, zero_stage: ZeroStage | int, pp: int
) -> OptimizerWrapper:
    """The wrapper DeepSpeed puts around the optimizer of a layout in ``precision`` at ZeRO
    ``zero_stage`` over ``pp`` pipeline stages (engine.py ``_configure_optimizer``; the table above)."""
    zero_stage = ZeroStage(zero_stage)
    if zero_stage.shards_parameters:
        return OptimizerWrapper.zero3_optimizer
    if zero_stage.shards_optimizer_states:
        return OptimizerWrapper.zero_optimizer
    match Precision(precision):
        case Precision.fp32:
            return OptimizerWrapper.none
        case Precision.bf16 if pp > 1:
            return OptimizerWrapper.bf16_optimizer
        case _:
            return OptimizerWrapper.fp16_unfused_optimizer


__all__ = ["OptimizerWrapper", "optimizer_wrapper"]
