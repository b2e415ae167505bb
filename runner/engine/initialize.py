"""DeepSpeed's engine around a built model, with DeepSpeed's faults fixed in one ordered place.

Each fault has its own module under runner/engine/fixes/, named for what it fixes and
citing DeepSpeed's file; :func:`apply_fixes` is the only place that applies them, in the
order written there.
"""

from __future__ import annotations

import logging
import warnings
from types import ModuleType

import torch

from runner.config import OptimizerConfig, Precision
from runner.engine import lean_zero_step
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.engine.fixes import (
    fp16_stage0_loss_scale,
    pickle_in_checkpoints,
    pipeline_fp32_clip,
    sequence_parallel_checkpoint_dims,
    stage0_step_at_construction,
    unfused_clip_norm,
)
from runner.engine.fixes.muon_compiles_at_import import import_muon_deferred
from runner.engine.param_groups import param_groups
from runner.engine.schedule import lr_multiplier
from runner.layout import Layout
from runner.rundir.json_types import JsonObject


class _UntestedOptimizerWarning(logging.Filter):
    """Drops DeepSpeed's "You are using ZeRO with an untested optimizer, proceed with caution"
    (runtime/engine.py ``_do_optimizer_sanity_check``), which it logs for any optimizer beyond its
    Adam list: ladder allows SGD under ZeRO on purpose (runner/engine/deepspeed_config.py), and its
    losses under ZeRO are the plain run's (tests/multirank/test_layout_invariance.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "untested optimizer" not in record.getMessage()


def _quiet_deepspeed() -> None:
    """DeepSpeed logs at INFO on every rank; the runner reports what matters itself."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    ds_logger.addFilter(_UntestedOptimizerWarning())
    # DeepSpeed's ZeRO collectives call torch names that torch 2.13 deprecates; the warning is
    # DeepSpeed's to fix and, on every rank at every step, hides the run's own lines.
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
        category=FutureWarning,
    )


def before_build() -> None:
    """What must happen before the model and engine are built: DeepSpeed's logs quietened, and its
    Muon module imported without compiling (DeepSpeed imports it whatever the optimizer)."""
    _quiet_deepspeed()
    import_muon_deferred()


def apply_fixes(engine: DeepSpeedEngine, *, layout: Layout, precision: Precision, grad_clip: float) -> None:
    """DeepSpeed 0.19.8's faults, fixed on a new engine in this order (each a no-op where it does
    not apply); nothing else in ladder patches DeepSpeed's engine for a fault."""
    # 1. Stage 0 in 16 bits: undo the optimizer step the wrapper takes at construction.
    stage0_step_at_construction.undo_prestep(engine.optimizer)
    # 2. Stage 0 in 16 bits under tp or pp: clip by the whole model's gradient norm.
    unfused_clip_norm.install(engine, tp=layout.tp, pp=layout.pp)
    # 3. fp16 at stage 0: scale the loss before backward, as the optimizer's step expects...
    fp16_stage0_loss_scale.install(engine)
    # 4. ...and unscale a step's gradients by the scale they had, not the grown one.
    fp16_stage0_loss_scale.grow_after_step(engine)
    # 5. fp32 stage 0 under a pipeline: clip by the norm of every stage's gradients.
    pipeline_fp32_clip.install(engine, pp=layout.pp, precision=precision, grad_clip=grad_clip)
    # 6. Every checkpoint file DeepSpeed loads is unpickled weights-only.
    pickle_in_checkpoints.install(engine)
    # 7. A sequence-parallel checkpoint says tp 1, so that its universal conversion reads it.
    if layout.sp > 1:
        sequence_parallel_checkpoint_dims.install()


def initialize_engine(
    model: torch.nn.Module,
    *,
    ds_config: JsonObject,
    optimizer: OptimizerConfig,
    total_steps: int,
    layout: Layout,
    precision: Precision,
    mpu: ModuleType | None = None,
) -> DeepSpeedEngine:
    """``deepspeed.initialize`` with ladder's parameter groups and schedule, then :func:`apply_fixes`,
    then ZeRO's optimizer step without its two needless passes over the gradients
    (runner/engine/lean_zero_step.py). ``mpu``: the sequence-parallel groups
    (runner/parallel/sequence.py), over which DeepSpeed then reduces the gradients."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    import deepspeed

    def lr_lambda(step: int) -> float:
        return lr_multiplier(
            step,
            warmup_steps=optimizer.warmup_steps,
            total_steps=total_steps,
            schedule=optimizer.schedule,
            min_lr_ratio=optimizer.min_lr_ratio,
        )

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, optimizer.weight_decay),
        config=ds_config,
        mpu=mpu,
        lr_scheduler=lambda torch_optimizer: torch.optim.lr_scheduler.LambdaLR(torch_optimizer, lr_lambda),
    )
    apply_fixes(engine, layout=layout, precision=precision, grad_clip=optimizer.grad_clip)
    lean_zero_step.install(engine)
    return engine
