"""fp16 at ZeRO stage 0 scales its loss before backward, as its optimizer's step expects.

DeepSpeed 0.19.8's ``DeepSpeedEngine.backward`` (runtime/engine.py) scales the loss only
for a ZeRO optimizer (``scale_if_loss``) or torch's autocast GradScaler. fp16 at stage 0,
``parallel=ddp`` (ladder's torch AdamW makes it ``FP16_UnfusedOptimizer``,
runtime/fp16/unfused_optimizer.py), falls through to a bare ``loss.backward()``, while
that optimizer's step still divides the gradients by its loss scale (2^16 at first): the
gradients are never scaled up against fp16's underflow, the update sees them 65,536x too
small (Adam's eps then weighs as if 65,536x larger), and clipping never acts (the norm it
compares is divided by the scale too). Measured, tiny on 1 rank, fp16: the losses with
``optimizer.grad_clip=1.0`` and ``0`` are the same to the bit. An open DeepSpeed pull
request (deepspeedai/DeepSpeed#8393) routes this case through the optimizer's own scaling.

:func:`install` does that here: for an fp16 engine without ZeRO, the loss handed to
``backward`` is multiplied by the optimizer's current scale first (its ``backward``'s
``loss.float() * cur_scale``). Under a pipeline the last stage's backward goes through the
same method (PipelineEngine ``_exec_backward_pass``: ``super().backward(self.loss)``),
and the earlier stages receive gradients already scaled.

On every layout the scale grows only once the step that earned the growth has unscaled its
gradients (:func:`grow_after_step`), and it goes on across a resume onto any layout
(:func:`scaler_state`, :func:`restore_scaler`, recorded in the checkpoint's latest.json).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.rundir.checkpoint_record import LossScaleState
from runner.rundir.summary_records import LossScaleRecord


def install(engine: DeepSpeedEngine) -> bool:
    """Scale the loss of this fp16 stage-0 engine before its backward; whether it needed it."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.runtime import engine as deepspeed_engine
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    if not engine.fp16_enabled() or engine.zero_optimization():
        return False
    if not isinstance(engine.optimizer, FP16_UnfusedOptimizer | FP16_Optimizer):
        return False
    unscaled_backward = deepspeed_engine.DeepSpeedEngine.backward

    @functools.wraps(unscaled_backward)
    def backward(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        if self is engine:
            scale = engine.optimizer.loss_scale_config
            if scale.use_grad_scaling:
                loss = loss.float() * scale.cur_scale
        return unscaled_backward(self, loss, *args, **kwargs)

    # Patched on the class: a pipeline's last stage calls it through super(). One engine per rank.
    deepspeed_engine.DeepSpeedEngine.backward = backward
    _report_unscaled_norm(engine.optimizer)
    return True


def _report_unscaled_norm(optimizer: Any) -> None:
    """After each step the optimizer's ``_global_grad_norm`` (the engine reports it) is the
    gradients' own norm: the wrapper leaves the norm of the scaled gradients there, where
    ZeRO's optimizers leave the unscaled one. Divided by the scale the backward used, read
    before the step (which may change it); an overflow's inf stays."""
    scaled_step = optimizer.step

    @functools.wraps(scaled_step)
    def step(*args: Any, **kwargs: Any) -> Any:
        scale = optimizer.loss_scale_config.cur_scale
        result = scaled_step(*args, **kwargs)
        norm = float(optimizer._global_grad_norm)
        if math.isfinite(norm):
            optimizer._global_grad_norm = norm / scale
        return result

    optimizer.step = step


def grow_after_step(engine: DeepSpeedEngine) -> bool:
    """Let the dynamic loss scale grow only after the step that earned it; whether it can grow.

    DeepSpeed 0.19.8 updates the scale before it unscales the step's gradients: stage 0's
    FP16_UnfusedOptimizer ``step`` calls ``_update_scale(False)``, then
    ``unscale_and_clip_grads`` with the scale now in force; ZeRO 1-2's ``step`` and ZeRO-3's
    (``_loss_scale_update_and_overflow_cleanup``) do the same. On the step that doubles the
    scale, the gradients, multiplied by the old scale in backward, are divided by the new one:
    the step takes half its gradient, unless clipping rescales it (tiny, 1 rank, grad_clip 0,
    precision.loss_scale_window=3: 2.2e-2 above the run whose scale never grows, at the step
    after). torch's GradScaler and Megatron-LM update the scale after the step; so does this:
    a growth is held back until the optimizer's step returns (an overflow's halving is not:
    that step is skipped, its gradients never used).
    """
    if _scaler(engine) is None:
        return False
    optimizer = engine.optimizer
    update_scale, step = optimizer._update_scale, optimizer.step
    grown: list[float] = []

    @functools.wraps(update_scale)
    def update_after_unscaling(*args: Any, **kwargs: Any) -> Any:
        scaler = _scaler(engine)  # looked up each time: a ZeRO resume replaces the object
        before = scaler.cur_scale
        result = update_scale(*args, **kwargs)
        if scaler.cur_scale > before:
            grown.append(scaler.cur_scale)
            scaler.cur_scale = before
        return result

    @functools.wraps(step)
    def step_then_grow(*args: Any, **kwargs: Any) -> Any:
        result = step(*args, **kwargs)
        if grown:
            _scaler(engine).cur_scale = grown[-1]
            grown.clear()
        return result

    optimizer._update_scale = update_after_unscaling
    optimizer.step = step_then_grow
    return True


# The dynamic loss scale's state: the scale, the optimizer steps counted (skipped ones
# included) and the last that overflowed, from which the scale grows again every
# ``scale_window`` steps. The same three fields in stage 0's LossScaleConfig and ZeRO's
# DynamicLossScaler (runtime/fp16/loss_scaler.py).
SCALER_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter")


def _scaler(engine: DeepSpeedEngine) -> Any:
    """The object that holds this fp16 engine's dynamic loss scale (None: not fp16 or static)."""
    if not engine.fp16_enabled():
        return None
    optimizer = engine.optimizer
    scaler = getattr(optimizer, "loss_scaler", None)  # ZeRO 1-3
    if scaler is None:
        scaler = getattr(optimizer, "loss_scale_config", None)  # stage 0's FP16_UnfusedOptimizer
    if scaler is None or not getattr(scaler, "dynamic", getattr(scaler, "dynamic_loss_scale", False)):
        return None
    return scaler


def scaler_state(engine: DeepSpeedEngine) -> dict[str, float] | None:
    """The dynamic loss scale's state for a checkpoint's record (None outside fp16).

    DeepSpeed keeps it in the optimizer's own checkpoint files, which a resume on another
    layout does not read (the universal checkpoint holds no loss scale): without it the
    scale starts again at 2^16 and skips steps the uninterrupted run takes.
    """
    scaler = _scaler(engine)
    if scaler is None:
        return None
    return {field: float(getattr(scaler, field)) for field in SCALER_FIELDS}


def restore_scaler(engine: DeepSpeedEngine, state: LossScaleState | None, *, window: int) -> bool:
    """Take up the loss scale ``state`` recorded; whether there was one to take up.

    The scale grows every ``window`` steps (this run's precision.loss_scale_window): a
    checkpoint carries its own (ZeRO pickles its scaler, stage 0 saves the field, and
    runner/checkpoint/stage0.py writes DeepSpeed's default), which would otherwise win.
    """
    scaler = _scaler(engine)
    if scaler is None:
        return False
    scaler.scale_window = window
    if not state:
        return False
    scaler.cur_scale = float(state["cur_scale"])
    scaler.cur_iter = int(state["cur_iter"])
    scaler.last_overflow_iter = int(state["last_overflow_iter"])
    return True


class OverflowLog:
    """fp16's steps the loss scaler skipped for an overflow, across resumes, and the scale reached.

    Such a step's reported norm is inf; one ladder skipped itself (train.on_nonfinite=skip,
    runner/train/nonfinite.py) is counted there instead. Recorded in latest.json with the scale's
    state and in summary.json as ``fp16_loss_scale``.
    """

    def __init__(self, engine: DeepSpeedEngine, record: LossScaleState | None) -> None:
        self._engine = engine
        self.steps: list[int] = list(record.get("overflow_steps", [])) if record else []

    def step_done(self, step: int, *, grad_norm: float | None, skipped: bool) -> None:
        """Note ``step`` if the loss scaler skipped it."""
        overflowed = grad_norm is not None and not math.isfinite(grad_norm)
        if overflowed and not skipped and _scaler(self._engine) is not None:
            self.steps.append(step)

    def state(self) -> LossScaleState | None:
        """For latest.json: the scale's state (:func:`restore_scaler`) and the steps so far."""
        state = scaler_state(self._engine)
        if state is None:
            return None
        return {
            "cur_scale": state["cur_scale"],
            "cur_iter": state["cur_iter"],
            "last_overflow_iter": state["last_overflow_iter"],
            "overflow_steps": list(self.steps),
        }

    def summary(self) -> LossScaleRecord | None:
        """For summary.json (None outside fp16)."""
        scale = current_scale(self._engine)
        return None if scale is None else {"final_scale": scale, "overflow_steps": list(self.steps)}


def current_scale(engine: DeepSpeedEngine) -> float | None:
    """The loss scale the next backward uses (None outside fp16), for the per-step metrics."""
    scaler = _scaler(engine)
    return None if scaler is None else float(scaler.cur_scale)


__all__ = [
    "SCALER_FIELDS",
    "OverflowLog",
    "current_scale",
    "grow_after_step",
    "install",
    "restore_scaler",
    "scaler_state",
]
