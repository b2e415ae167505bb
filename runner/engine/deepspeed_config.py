"""The one function that writes DeepSpeed's config dict.

Batch sizes, the ZeRO stage, precision flags and the optimizer are written here and
nowhere else; the run directory keeps the result as ``deepspeed_config.json``. There
are no ``"auto"`` placeholders: every value is derived from the typed config and the
resolved :class:`~runner.layout.Layout`.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import (
    ModelConfig,
    Offload,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    Precision,
    PrecisionConfig,
    ZeroStage,
)
from runner.layout import Layout
from runner.model.shape import num_params
from runner.parallel.tensor import deepspeed_train_batch_size, tensor_parallel_section
from runner.rundir.json_types import JsonObject

# DeepSpeed prints its own per-step lines every `steps_per_print` steps; the runner logs
# its metrics itself, so DeepSpeed's are pushed out of the way.
_QUIET_STEPS = 1_000_000_000


def _optimizer_section(optimizer: OptimizerConfig, *, lr: float, offload: bool) -> JsonObject:
    """DeepSpeed's ``optimizer`` section at learning rate ``lr``: AdamW (torch's, or DeepSpeedCPUAdam
    when offloaded) or SGD.

    torch's optimizers are asked for their fused kernel, which updates the states in place.
    Their defaults allocate during the step, where the memory plan does not look: the
    foreach path (CUDA) a temporary the size of the parameters it steps (Adam's
    ``torch._foreach_sqrt`` of the second moments; SGD's weight-decayed gradients), the
    per-tensor loop (CPU) up to two of the largest tensor (tests/unit/runner/engine/test_optimizer_step.py).
    """
    if optimizer.name == OptimizerName.adamw:
        params: JsonObject = {
            "lr": lr,
            "betas": [optimizer.beta1, optimizer.beta2],
            "eps": optimizer.eps,
            "weight_decay": optimizer.weight_decay,
        }
        if not offload:
            # torch.optim.AdamW rather than DeepSpeed's FusedAdam: no JIT-built op, on CPU or GPU.
            params["torch_adam"] = True
            params["adam_w_mode"] = True
            params["fused"] = True
        return {"type": "AdamW", "params": params}
    # DeepSpeed builds any other name from torch.optim (engine._configure_basic_optimizer).
    return {
        "type": "SGD",
        "params": {
            "lr": lr,
            "momentum": optimizer.momentum,
            "weight_decay": optimizer.weight_decay,
            "fused": True,
        },
    }


def reduce_bucket_elements(reduce_bucket_size: int, model: ModelConfig) -> int:
    """The gradient bucket DeepSpeed allocates: ``parallel.reduce_bucket_size``, at most the model's size.

    ZeRO-3 allocates the bucket whole at initialize, ZeRO 1-2 at backward's first gradient
    (stage3.py and stage_1_and_2.py ``setup_buckets``, DeepSpeed 0.19), and each fills it with
    gradients until the next would overflow it, then reduces. A bucket of the whole model's
    parameter count never overflows (a rank holds at most that many), so it reduces exactly
    as any larger one: the cap changes no collective, only memory. DeepSpeed's default of
    5e8 elements is 2 GB in fp32 whatever the model; the tiny model needs 13 MB of it.

    ZeRO-3 keeps this size rather than Hugging Face's h^2 (h = ``model.d_model``; transformers
    integrations/deepspeed.py ``trainer_config_finalize``): a gradient larger than the bucket
    is reduce-scattered on its own (stage3.py ``__add_grad_to_ipg_bucket``), so h^2 makes a
    reduce-scatter of about every tensor (tiny has 38) where the capped bucket makes one per
    micro-batch. Measured on 2 CPU ranks (tiny, fp32, micro 4, accum 2): steps of 0.49-0.57 s
    with h^2 against 0.42 s, to hold 13 MB less (1 GB less for llama_7b in bf16). Setting
    ``parallel.reduce_bucket_size`` trades the other way.
    """
    return min(reduce_bucket_size, num_params(model))


@dataclass(frozen=True)
class Zero3Fetch:
    """ZeRO-3's parameter fetching as DeepSpeed is given it: each ``parallel`` key's number."""

    # Parameters of at most this many elements stay whole on every rank, never gathered
    # (DeepSpeed 0.19.8 parameter_offload.py ``mark_persistent_parameters``: ``ds_numel <=``).
    param_persistence_threshold: int
    # Elements gathered ahead of the module that needs them, in the order the first step
    # traced (partitioned_param_coordinator.py ``fetch_sub_module``); each prefetch may pass
    # it by one tensor.
    prefetch_bucket_size: int
    # Prefetching goes on only while fewer elements than this are gathered (the same function:
    # ``min(max_live - n_available, prefetch_bucket)``); it bounds the prefetch only, not the
    # parameters a module needs now, nor those ``stage3_max_reuse_distance`` keeps gathered.
    max_live_parameters: int


def persistence_threshold_elements(param_persistence_threshold: int | None, model: ModelConfig) -> int:
    """ZeRO-3's persistence threshold: ``parallel.param_persistence_threshold``; null: 10 x ``d_model``."""
    if param_persistence_threshold is None:
        return 10 * model.d_model
    return param_persistence_threshold


def zero3_fetch(parallel: ParallelConfig, model: ModelConfig) -> Zero3Fetch:
    """ZeRO-3's fetch knobs: the user's numbers, else derived from the model's width h = ``model.d_model``.

    Derived as Hugging Face's DeepSpeed integration fills ``"auto"`` (transformers
    integrations/deepspeed.py ``HfTrainerDeepSpeedConfig.trainer_config_finalize``): a
    persistence threshold of 10h keeps the norms' gains (h elements each) whole and partitions
    every matrix; a prefetch bucket of 0.9 h^2 gathers about one matrix ahead. DeepSpeed's
    defaults (1e5 and 5e7) are the same for any width: 1e5 keeps the tiny model's 17 h x h
    tensors (65,536 elements) whole on every rank, and no tensor of the larger shipped models;
    5e7 prefetches the whole tiny model, a quarter of a llama_7b block. Measured on 2 CPU ranks
    (tiny, fp32, micro 4, accum 2): steps of 0.42 s against 0.37-0.39 s with DeepSpeed's two,
    the price of gathering those 17 tensors in every forward and backward.
    ``max_live_parameters`` is given as set (DeepSpeed's 1e9 by default; Hugging Face leaves
    it too).
    """
    h, prefetch = model.d_model, parallel.prefetch_bucket_size
    return Zero3Fetch(
        param_persistence_threshold=persistence_threshold_elements(
            parallel.param_persistence_threshold, model
        ),
        prefetch_bucket_size=int(0.9 * h * h) if prefetch is None else prefetch,
        max_live_parameters=parallel.max_live_parameters,
    )


def _zero_section(parallel: ParallelConfig, model: ModelConfig) -> JsonObject:
    """DeepSpeed's ``zero_optimization`` section."""
    zero: JsonObject = {
        "stage": parallel.zero_stage,
        "overlap_comm": ZeroStage(parallel.zero_stage).overlaps_comm(parallel.overlap_comm),
        "contiguous_gradients": parallel.contiguous_gradients,
        "reduce_bucket_size": reduce_bucket_elements(parallel.reduce_bucket_size, model),
        "allgather_bucket_size": parallel.allgather_bucket_size,
    }
    if ZeroStage(parallel.zero_stage) is ZeroStage.zero3:
        fetch = zero3_fetch(parallel, model)
        zero["stage3_param_persistence_threshold"] = fetch.param_persistence_threshold
        zero["stage3_prefetch_bucket_size"] = fetch.prefetch_bucket_size
        zero["stage3_max_live_parameters"] = fetch.max_live_parameters
    if parallel.offload_optimizer == Offload.cpu:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if parallel.offload_param == Offload.cpu:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return zero


def _precision_section(precision: PrecisionConfig) -> JsonObject:
    """The ``bf16`` / ``fp16`` flags; fp32 sets neither."""
    if precision.name == Precision.bf16:
        return {"bf16": {"enabled": True}}
    if precision.name == Precision.fp16:
        # Dynamic loss scaling (loss_scale 0), starting at 2**16 as Megatron-LM does, halved
        # at every overflow: stage 0's FP16_UnfusedOptimizer knows no hysteresis
        # (runtime/fp16/unfused_optimizer.py ``_update_scale``), ZeRO's DynamicLossScaler
        # would wait for a second overflow (hysteresis 2 by default) and so skip other steps.
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "hysteresis": 1,
                "loss_scale_window": precision.loss_scale_window,
            }
        }
    return {}


def build_deepspeed_config(
    *,
    layout: Layout,
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    optimizer: OptimizerConfig,
    lr: float,
    load_universal: bool = False,
) -> JsonObject:
    """DeepSpeed's config dict for one layout; ``lr`` is the effective (scaled) learning rate."""
    offloaded = parallel.offload_optimizer != Offload.none
    # Under a pipeline, tp is the pipeline grid's model axis, split by ladder itself
    # (runner/parallel/pipeline_tensor.py); only without one is it DeepSpeed's AutoTP.
    autotp = layout.tp if layout.pp == 1 else 1
    # global = micro x accum x dp: DeepSpeed checks the same identity at initialize
    # (with tensor parallelism, in its own count: runner/parallel/tensor.py; None: unset).
    train_batch_size = deepspeed_train_batch_size(
        global_size=layout.global_size, tp=autotp, zero_stage=parallel.zero_stage
    )
    config: JsonObject = {
        **({"train_batch_size": train_batch_size} if train_batch_size is not None else {}),
        "train_micro_batch_size_per_gpu": layout.micro_size,
        "gradient_accumulation_steps": layout.accum_steps,
        "gradient_clipping": optimizer.grad_clip,
        "optimizer": _optimizer_section(optimizer, lr=lr, offload=offloaded),
        "zero_optimization": _zero_section(parallel, model),
        "steps_per_print": _QUIET_STEPS,
        "wall_clock_breakdown": False,
        **_precision_section(precision),
        **tensor_parallel_section(autotp),
    }
    if load_universal:
        # Resuming onto another layout: DeepSpeed reads the universal checkpoint format.
        config["checkpoint"] = {"load_universal": True}
    if offloaded:
        # ZeRO-Offload steps the optimizer on the host with DeepSpeedCPUAdam.
        config["zero_force_ds_cpu_optimizer"] = True
    zero_stage = ZeroStage(parallel.zero_stage)
    if optimizer.name != OptimizerName.adamw and zero_stage.shards_optimizer_states:
        # DeepSpeed's ZeRO asserts on any optimizer outside its Adam list unless told; SGD is
        # elementwise, so stepping it on a partition is stepping it on the whole.
        config["zero_allow_untested_optimizer"] = True
    if precision.name == Precision.fp16 and zero_stage is ZeroStage.ddp:
        # Stage 0 all-reduces fp16 gradients summed, then divides by dp (engine.py
        # ``allreduce_bucket``): a sum of dp loss-scaled gradients overflows where their mean
        # does not, and the step is skipped where one rank's run takes it (tiny, dp 2: an
        # extra skipped step, another experiment). Dividing first keeps the mean in range,
        # as ZeRO 1-2's reduction does (DeepSpeed's ``prescale_gradients``).
        config["prescale_gradients"] = True
    return config
