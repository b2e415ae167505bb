"""Every pass one optimizer step makes over the gradients and parameters outside the model's own
kernels, line by line: what the engine copies, casts, scales or reduces through, as DeepSpeed
0.19.8 runs it under ladder (runner/engine/lean_zero_step.py removes three of its copies).

Each line is the bytes one rank reads and writes per optimizer step, with the DeepSpeed code
that makes it. ``fresh``: written into a tensor allocated for it, which on a CPU above glibc's
mmap threshold costs page faults (runner/step_time/calibrated_terms.py prices it so). The step-time model
sums them into its ``optimizer``, ``zero grads`` and ``grad flatten`` terms, and ``plan=true``
prints them under its time table, so a reader sees which copies remain and what each costs.

With ``local`` parameters on the rank, ``g`` bytes per gradient element (2 in 16-bit, 4 in
fp32), ``stepped`` the elements the rank's optimizer steps (``local / dp`` under ZeRO):

- ZeRO-0 (engine.py ``buffered_allreduce_fallback``): the gradients flattened into a new
  buffer for the all-reduce, and the reduced values copied back; in 16-bit its
  FP16_UnfusedOptimizer casts every gradient to fp32 and the stepped fp32 weights back.
- ZeRO-1/2 (stage_1_and_2.py): every gradient copied into the reduce bucket and the bucket
  flattened for the collective, at each reduce (once a step at stage 1, every micro-batch at
  stage 2); at the step the partition written as the fp32 gradients the optimizer steps
  (fp32: DeepSpeed's flatten, which ``.to`` leaves as it is; 16-bit: ladder's one-pass cast),
  and the stepped fp32 partition copied back into the model's parameters.
- ZeRO-3 (stage3.py): the partition written as fp32 gradients (``_prepare_fp32_grad_for_sub_group``)
  and the stepped partition copied back; its gathers are ZeRO-3's own terms.
- Every stage: the gradient norm reads every gradient once (under ZeRO without DeepSpeed's
  whole fp64 copy of each); DeepSpeed's clip scales the fp32 gradients in place, a pass
  ladder folds into torch's fused kernel under ZeRO (not offloaded).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import OffloadPlacement, Precision, ZeroStage

OPTIMIZER, ZERO_GRADS, FLATTEN = "optimizer", "zero grads", "grad flatten"  # calibrated_terms's terms


@dataclass(frozen=True)
class StepCopy:
    """One pass of the step over the gradients or parameters, on the fullest rank."""

    name: str
    read: float  # bytes read per optimizer step
    written: float  # bytes written per optimizer step
    fresh: bool  # written into a tensor allocated for it
    source: str  # the DeepSpeed 0.19.8 code that makes it
    term: str = "optimizer"  # the step-time term it is part of (runner/step_time/calibrated_terms.py)
    times: int = 1  # passes a step makes of it (the bytes above are all of them)


def step_copies(
    *,
    zero_stage: ZeroStage,
    precision: Precision,
    offload: OffloadPlacement,
    dp: int,
    accum_steps: int,
    local: int,
) -> list[StepCopy]:
    """The passes of one optimizer step on a rank holding ``local`` parameters (module docstring)."""
    if zero_stage is ZeroStage.ddp:
        return _ddp_step_copies(precision=precision, local=local)
    return _zero_step_copies(
        zero_stage=zero_stage,
        precision=precision,
        offload=offload,
        dp=dp,
        accum_steps=accum_steps,
        local=local,
    )


def _ddp_step_copies(*, precision: Precision, local: int) -> list[StepCopy]:
    """The passes of a DDP step: the norm, the all-reduce's flatten and copy back, in 16-bit the
    unfused optimizer's casts, and the clip over fp32 gradients."""
    grads = local * Precision(precision).bytes
    copies = [
        StepCopy("gradient norm", grads, 0, False, "the clip's norm over every gradient"),
        StepCopy(
            "gradients flattened for the all-reduce",
            grads,
            grads,
            True,
            "engine.py allreduce_bucket",
            FLATTEN,
        ),
        StepCopy(
            "all-reduced gradients copied back",
            grads,
            grads,
            False,
            "engine.py allreduce_and_copy",
            FLATTEN,
        ),
    ]
    clipper = "engine.py clip_fp32_gradients"
    if precision != Precision.fp32:
        clipper = "unfused_optimizer.py unscale_and_clip_grads"
        copies += [
            StepCopy("gradients cast to fp32", grads, 4 * local, False, "unfused_optimizer.py step"),
            StepCopy(
                "fp32 weights back into the model's", 4 * local, grads, False, "unfused_optimizer.py step"
            ),
        ]
    return [
        *copies,
        StepCopy("clip: fp32 gradients scaled", 4 * local, 4 * local, False, clipper),
    ]


def _zero_step_copies(
    *,
    zero_stage: ZeroStage,
    precision: Precision,
    offload: OffloadPlacement,
    dp: int,
    accum_steps: int,
    local: int,
) -> list[StepCopy]:
    """The passes of a ZeRO step over this rank's partition: the norm, at stages 1-2 the reduce
    bucket's copies, the fp32 gradients and weights, and under offload the clip."""
    g = Precision(precision).bytes
    grads = local * g
    stepped = -(-local // max(1, dp))
    norm = "the clip's norm over the partition"
    if offload == OffloadPlacement.none:
        norm += ", fp64 in chunks: runner/engine/lean_zero_step.py"
    copies = [StepCopy("gradient norm", stepped * g, 0, False, norm)]
    if zero_stage in (ZeroStage.zero1, ZeroStage.zero2):
        reduces = accum_steps if zero_stage.shards_gradients else 1
        where = "stage_1_and_2.py"
        copies += [
            StepCopy(
                "gradients into the reduce bucket",
                reduces * grads,
                reduces * grads,
                True,
                f"{where} copy_grads_in_partition",
                ZERO_GRADS,
                reduces,
            ),
            StepCopy(
                "reduce bucket flattened",
                reduces * grads,
                reduces * grads,
                True,
                f"{where} flatten_dense_tensors",
                ZERO_GRADS,
                reduces,
            ),
        ]
        where += " step"
    else:
        where = "stage3.py _prepare_fp32_grad_for_sub_group"
    if precision != Precision.fp32:
        where += "; one pass: runner/engine/lean_zero_step.py"
    copies += [
        StepCopy("partition written as fp32 gradients", stepped * g, stepped * 4, True, where),
        StepCopy("fp32 partition back into the model's", stepped * 4, stepped * g, False, "the step's copy_"),
    ]
    if offload != OffloadPlacement.none:
        copies.append(
            StepCopy("clip: fp32 gradients scaled", 4 * stepped, 4 * stepped, False, "unscale_and_clip_grads")
        )
    return copies


__all__ = ["FLATTEN", "OPTIMIZER", "ZERO_GRADS", "StepCopy", "step_copies"]
