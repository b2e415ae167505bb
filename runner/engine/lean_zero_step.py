"""Three copies of the gradients that DeepSpeed's ZeRO optimizer step makes and need not.

DeepSpeed 0.19.8's ZeRO step (stage_1_and_2.py ``step``, stage3.py ``step``) prepares each
gradient partition for the fp32 optimizer in these passes:

1. for the clip's norm it casts every gradient whole to fp64 (``get_grad_norm_direct``:
   ``g.to(get_norm_dtype())``), a new tensor of 8 B per element, and reduces that;
2. it flattens the partition's gradients into a new tensor in their own dtype
   (``self.flatten``, i.e. ``torch.cat``);
3. it casts that to fp32 (``.to``), a second new tensor;
4. it scales the fp32 copy by the clipping factor in place (``unscale_and_clip_grads``
   ``mul_``; stage 3 does this even when the factor is 1).

Then torch's fused optimizer reads the copy once more. ladder removes the copies of 1, 2
and 4, doing the same arithmetic:

- **the norm in chunks**: each gradient is cast to fp64 a chunk at a time, small enough to
  stay in the caches, and the chunks' fp64 norms combined (:func:`norm_in_fp64`); the
  norm is DeepSpeed's to within fp64's rounding (1e-13 relative).
- **one cast** (16-bit training only; in fp32, ``.to`` copies nothing already): the
  gradients are written straight into the fp32 partition, each by one casting copy.
  The 16-bit flat copy is never made: 2 B per element of the partition less at the
  step's peak (runner/memory_model/peak_lines.py ``optimizer_step_bytes``), one read and one write of
  it less in time.
- **the clip inside the optimizer's kernel**: torch's fused AdamW and SGD divide the
  gradients by ``optimizer.grad_scale`` inside their kernel (the hook torch's GradScaler
  uses, ``_step_supports_amp_scaling``), so the combined loss-scale and clip factor is
  handed to it instead of scaled in its own pass: one read and one write of 4 B per
  element less. The kernel divides by the factor where DeepSpeed multiplies by its
  reciprocal, so a clipped gradient can differ in its last bit (about 1e-7 relative).

None applies under ZeRO-Offload (DeepSpeedCPUAdam steps on the host), to Muon, or with
torch's autocast GradScaler; ZeRO-0 steps through other wrappers and is left as it is.
The plan lists what remains, copy by copy (runner/step_time/optimizer_step_passes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from runner.config import ZeroStage
from runner.engine.deepspeed_engine import DeepSpeedEngine

ONE_CAST = "one cast"
CLIP_IN_KERNEL = "clip in kernel"
NORM_IN_CHUNKS = "norm in chunks"
# Elements of a gradient cast to fp64 at a time for its norm: 8 MiB of fp64, which stays in a
# CPU's caches and a GPU's L2. Measured on this CPU over gpt2_124m's 38.6M-element embedding
# gradient in bf16: 89 ms cast whole, 17-22 ms in chunks of 2^14 to 2^20, 45 ms in 2^22.
NORM_CHUNK = 2**20


def _zero_optimizer(engine: DeepSpeedEngine) -> tuple[Any, ZeroStage] | None:
    """DeepSpeed's ZeRO 1-3 wrapper and its stage, when it steps torch's optimizer on the device."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    wrapper = engine.optimizer
    if isinstance(wrapper, DeepSpeedZeroOptimizer_Stage3):
        zero_stage, offloaded = ZeroStage.zero3, bool(wrapper.offload_optimizer)
    elif isinstance(wrapper, DeepSpeedZeroOptimizer):
        zero_stage = ZeroStage.zero2 if wrapper.partition_gradients else ZeroStage.zero1
        offloaded = bool(wrapper.cpu_offload)
    else:
        return None
    plain = not (offloaded or getattr(wrapper, "use_muon", False) or wrapper.torch_autocast_gradscaler)
    return (wrapper, zero_stage) if plain else None


def _fp32_partitions(wrapper: Any, zero_stage: ZeroStage) -> list[torch.Tensor]:
    """The fp32 partitions the inner optimizer steps (its master weights), one per group."""
    stage3 = zero_stage is ZeroStage.zero3
    return wrapper.fp32_partitioned_groups_flat if stage3 else wrapper.single_partition_of_fp32_groups


def cast_in_one_pass(tensors: Sequence[torch.Tensor], numel: int, dtype: torch.dtype) -> torch.Tensor:
    """``tensors`` flattened into one new ``dtype`` tensor of ``numel`` elements, zero-padded at the end:
    what DeepSpeed's flatten-then-``.to`` makes, written once."""
    flat = torch.empty(numel, dtype=dtype, device=tensors[0].device)
    filled = sum(t.numel() for t in tensors)
    if filled > numel:
        raise ValueError(f"{filled} gradient elements do not fit a partition of {numel}")
    # One casting copy per tensor: on a CPU faster than ``torch.cat(out=)`` across dtypes
    # (gpt2_124m's gradients, bf16 into fp32: 145 ms against 176, and 215 for flatten + ``.to``).
    start = 0
    for tensor in tensors:
        flat[start : start + tensor.numel()].copy_(tensor.reshape(-1))
        start += tensor.numel()
    flat[filled:].zero_()
    return flat


def _install_one_cast(wrapper: Any, zero_stage: ZeroStage) -> bool:
    """Stage 1-2: DeepSpeed's pre-flattened-partition hook returns the fp32 partition; stage 3:
    ``_prepare_fp32_grad_for_sub_group`` writes it in one pass."""
    masters = _fp32_partitions(wrapper, zero_stage)
    if wrapper.dtype == masters[0].dtype:  # the model's parameters' dtype, the gradients' too
        return False  # fp32 training: DeepSpeed's ``.to`` is already no copy
    if zero_stage is ZeroStage.zero3:

        def prepare_fp32_grad(sub_group_id: int) -> None:
            master = masters[sub_group_id]
            grads = wrapper.averaged_gradients[sub_group_id]
            master.grad = cast_in_one_pass(grads, master.numel(), master.dtype)
            if master.device.type != "cpu":  # as DeepSpeed: the gradients were made on another stream
                for grad in grads:
                    grad.record_stream(torch.cuda.current_stream())
            wrapper.averaged_gradients[sub_group_id] = None

        wrapper._prepare_fp32_grad_for_sub_group = prepare_fp32_grad
        return True
    preflattened = wrapper._get_preflattened_grad_partition

    def fp32_partition(group: int) -> torch.Tensor:
        found = preflattened(group)  # a partition DeepSpeed's own passes flattened already
        if found is not None:
            return found
        master = masters[group]
        return cast_in_one_pass(
            wrapper.averaged_gradients[group], int(wrapper.partition_size[group]), master.dtype
        )

    wrapper._get_preflattened_grad_partition = fp32_partition
    return True


def norm_in_fp64(grad: torch.Tensor) -> torch.Tensor:
    """The L2 norm of ``grad`` accumulated in fp64, as DeepSpeed takes it, without its fp64 copy:
    each chunk of :data:`NORM_CHUNK` elements cast and reduced, then the chunks' norms combined
    (within about 1e-13 of DeepSpeed's figure, fp64's own rounding)."""
    pieces = grad.detach().reshape(-1).split(NORM_CHUNK)
    norms = [torch.linalg.vector_norm(piece, dtype=torch.float64) for piece in pieces]
    return torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else norms[0]


def _install_norm_in_chunks(wrapper: Any) -> bool:
    """DeepSpeed's ``get_grad_norm_direct`` (both stages) casts every gradient whole to fp64
    (``g.to(get_norm_dtype())``) before its norm: a new tensor of 8 B per element written and
    read again. It is handed each gradient's fp64 norm instead, as a one-element fp64 tensor,
    whose cast is no copy and whose norm is itself; the rest of DeepSpeed's function (which
    tensors count, the reductions over ranks, the invalid-norm sentinel) runs as it is."""
    direct = wrapper.get_grad_norm_direct

    def grad_norm_direct(gradients: Sequence[Any], params: Any, norm_type: float = 2) -> Any:
        if float(norm_type) != 2.0:
            return direct(gradients, params, norm_type)
        proxies = []
        for grad in gradients:
            proxy = norm_in_fp64(grad).reshape(1)
            if getattr(grad, "_zero_padding", False):  # stage 1-2 leave the padding out
                proxy._zero_padding = True  # type: ignore[attr-defined]
            proxies.append(proxy)
        return direct(proxies, params, norm_type)

    wrapper.get_grad_norm_direct = grad_norm_direct
    return True


def _combined_scale(wrapper: Any, total_norm: Any) -> Any:
    """DeepSpeed's loss scale times its clipping factor (``unscale_and_clip_grads``, both stages)."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.runtime.utils import is_invalid_grad_norm

    combined = wrapper.loss_scale
    if wrapper.clip_grad > 0.0:
        clip_norm = total_norm
        if is_invalid_grad_norm(clip_norm):
            clip_norm = torch.tensor(
                float("inf"),
                dtype=torch.float,
                device=total_norm.device if isinstance(total_norm, torch.Tensor) else None,
            )
        clip = torch.clamp(((clip_norm / wrapper.loss_scale) + 1e-6) / wrapper.clip_grad, min=1.0)
        combined = clip * wrapper.loss_scale
    return combined


def _install_clip_in_kernel(wrapper: Any, zero_stage: ZeroStage) -> bool:
    """Hand DeepSpeed's clip factor to the fused kernel as ``grad_scale`` for the one step it runs."""
    inner = wrapper.optimizer
    if not getattr(inner, "_step_supports_amp_scaling", False):
        return False  # not a fused torch optimizer: DeepSpeed's own pass stays
    device = _fp32_partitions(wrapper, zero_stage)[0].device

    def unscale_and_clip(grads_or_group: Any, total_norm: Any) -> None:
        if zero_stage is not ZeroStage.zero3 and wrapper.clip_grad == 0.0 and wrapper.loss_scale == 1.0:
            return  # DeepSpeed's stage 1-2 skip the pass here too
        combined = _combined_scale(wrapper, total_norm)
        inner.grad_scale = torch.as_tensor(combined, dtype=torch.float32, device=device)

    step_one: Callable[[int], None] = wrapper._optimizer_step

    def optimizer_step(group: int) -> None:
        try:
            step_one(group)
        finally:
            inner.__dict__.pop("grad_scale", None)

    wrapper.unscale_and_clip_grads = unscale_and_clip
    wrapper._optimizer_step = optimizer_step
    return True


def install(engine: DeepSpeedEngine) -> list[str]:
    """Remove the copies from this engine's ZeRO step where they apply; which changes were made."""
    found = _zero_optimizer(engine)
    if found is None:
        return []
    wrapper, zero_stage = found
    removed = []
    if _install_one_cast(wrapper, zero_stage):
        removed.append(ONE_CAST)
    if _install_clip_in_kernel(wrapper, zero_stage):
        removed.append(CLIP_IN_KERNEL)
    if _install_norm_in_chunks(wrapper):
        removed.append(NORM_IN_CHUNKS)
    return removed


__all__ = ["CLIP_IN_KERNEL", "NORM_IN_CHUNKS", "ONE_CAST", "cast_in_one_pass", "install", "norm_in_fp64"]
