"""Per-device memory of one layout: the four terms, DeepSpeed's named residuals, and the host side.

Pure arithmetic over runner.memory_model's states and activations (bytes in, bytes out;
nothing is allocated). What a layout changes:

- tensor parallel t and pipeline parallel p split the parameters, counted tensor by
  tensor for the fullest rank (runner/parallel/pipeline_split.py ``rank_param_numels``): t splits
  every block matrix, and the embedding and output head by vocabulary, while the norms
  stay whole on every rank (runner/parallel/tensor.py); p gives each stage its blocks,
  the first stage the embedding and the last the final norm and the output head (a tied
  embedding counts on both). ZeRO then shards that over dp (runner.memory_model.model_states),
  ZeRO-1/2 gradients as the fullest data-parallel rank holds them
  (runner.memory_model.zero12_held_elements).
- t splits the per-head and MLP-hidden activations (Korthikanti et al. 2022, arXiv
  2205.05198, eq. 2; runner.memory_model.BlockShape takes ``tp``).
- p gives each stage ceil(L / p) layers. Under the 1F1B schedule the first stage holds
  the activations of min(p, accum) micro-batches in flight (Narayanan et al. 2021,
  arXiv 2104.04473, Sec. 2.2.1: "at most p outstanding forward passes"); the last stage
  holds one, plus the loss and logits; DeepSpeed's pipeline buffers add the logits and the
  received inputs of the micro-batches they keep, and the buffers activations and gradients
  arrive in (``activation_bytes``). The plan takes the larger of the two stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.config import OffloadPlacement, ZeroStage
from runner.engine.optimizer_wrapper import OptimizerWrapper, optimizer_wrapper
from runner.memory_model.activations import (
    BlockShape,
    activation_items_total,
    offloaded_block_inputs,
    offloads_block_inputs,
)
from runner.memory_model.case import HeldStates, MemoryCase, held_states
from runner.memory_model.peak_lines import (
    ALLREDUCE_FLAT,
    BF16_PARAM_GRADS,
    OPTIMIZER_STEP,
    THROUGH_THE_STEP,
    TIED_GRADIENT_JOIN,
    TIED_HEAD_GRADIENT,
    activation_bytes,
    allreduce_flat_bytes,
    beyond_activations_after_head,
    first_stage_grads_after_peak,
    grads_after_activation_peak,
    layers_per_stage,
    mlp_backward_bytes,
    optimizer_step_bytes,
    pipeline_stage_bytes,
    tied_gradient_join_bytes,
    tied_head_gradient_bytes,
    zero3_tp_build_bytes,
)
from runner.memory_model.states import zero12_backward_buckets

OFFLOADED_ACTIVATIONS = "activations"  # MemoryTerms.host's line of model.offload_activations


@dataclass(frozen=True)
class MemoryTerms:
    """Bytes per device of each term of one layout at one micro-batch size."""

    params: int
    grads: int
    optimizer: int
    activations: int
    residuals: dict[str, int] = field(default_factory=dict)  # runner.memory_model.deepspeed_residuals
    host: dict[str, int] = field(default_factory=dict)  # offloaded terms and buffers per rank, host memory
    host_counts_on_device: bool = False  # CPU ranks: the host is the device
    activation_note: str = ""
    build: int = 0  # device bytes while the model is built, where it can hold more (zero3_tp_build_bytes)
    grads_after_peak: int = 0  # gradient bytes made after the activation peak (grads_after_activation_peak)
    step: int = 0  # device bytes inside the optimizer step (optimizer_step_bytes), 0 where it adds none

    @property
    def model_states(self) -> int:
        """Parameters + gradients + optimizer states on the device."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        """All device bytes: model states, activations, residuals (and offloaded bytes on CPU ranks)."""
        extra = sum(self.host.values()) if self.host_counts_on_device else 0
        terms = self.model_states + self.activations + sum(self.residuals.values()) + extra
        return terms - self.grads_after_peak

    @property
    def peak(self) -> int:
        """The device bytes to fit: backward's total, or the step or the build where they hold more."""
        return max(self.total, self.build, self.step)

    def largest(self) -> tuple[str, int]:
        """The largest named term: what to shrink first (the build or the step, where it is the peak)."""
        if self.build > max(self.total, self.step):
            return "build (zero.Init's 1/dp of the whole model, before AutoTP)", self.build
        if self.step > self.total:
            return OPTIMIZER_STEP, self.step
        terms = {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            **self.residuals,
        }
        name = max(terms, key=lambda k: terms[k])
        return name, terms[name]


@dataclass(frozen=True)
class _Activations:
    """One stage's activation items, its peak activation bytes (activation_bytes) and what they rest on."""

    items: dict[str, int]  # runner.memory_model.activation_items_total of the fullest stage's layers
    peak: int
    note: str
    stage_input: int  # one micro-batch's hidden states between stages (pipeline_stage_bytes)
    block_backward: int  # mlp_backward_bytes


def _activations(case: MemoryCase, block: BlockShape, accum_steps: int) -> _Activations:
    """The fullest stage's activation items and peak at this micro-batch."""
    items = activation_items_total(
        block,
        n_layers=layers_per_stage(case.model.n_layer, case.spec.pp),
        vocab_size=case.model.vocab_size,
        recompute=case.spec.recompute,
        offloaded=_offloads_activations(case),
    )
    stage_input = block.bytes_per_elem * case.micro_size * case.seq_len * case.model.d_model
    block_backward = mlp_backward_bytes(block)
    peak, note = activation_bytes(
        items,
        pp=case.spec.pp,
        accum_steps=accum_steps,
        stage_input=stage_input,
        block_backward=block_backward,
    )
    if block.graph != "eager":
        how = "compiled blocks" if block.graph == "whole" else "compiled blocks, split at collectives"
        note = f"{how}; {note}" if note else how
    return _Activations(items, peak, note, stage_input, block_backward)


def _offloads_activations(case: MemoryCase) -> bool:
    """``model.offload_activations`` moves this layout's block inputs to the host (offloads_block_inputs)."""
    return offloads_block_inputs(
        case.model, recompute=case.spec.recompute, host_is_device=case.host_is_device
    )


def _offloaded_activations(case: MemoryCase, block: BlockShape) -> dict[str, int]:
    """The host line of the offloaded block inputs, per rank (offloaded_block_inputs); empty: none.

    One micro-batch's: the offload's context spans one forward and its backward
    (runner/train/trainer.py), and its host buffers are reused by the next micro-batch.
    """
    if not _offloads_activations(case):
        return {}
    moved = offloaded_block_inputs(block, n_layers=layers_per_stage(case.model.n_layer, case.spec.pp))
    return {OFFLOADED_ACTIVATIONS: moved} if moved else {}


def _in_backward_lines(
    case: MemoryCase, act: _Activations, buckets: dict[str, int], *, tied: int, accum_steps: int
) -> dict[str, int]:
    """No pipeline: ZeRO-1/2's buckets and a tied head's gradient, what they add to the activation peak."""
    lines: dict[str, int] = {}
    # ZeRO-1 reduces at the step's boundary only: the bucket its first micro-batch
    # allocates stays until then, live at every later micro-batch's loss: all of it adds.
    to_boundary = case.spec.zero_stage is ZeroStage.zero1 and accum_steps > 1
    for name, size in buckets.items():
        if to_boundary:
            lines[name] = size
        elif beyond := beyond_activations_after_head(act.items, allocated=size):
            lines[name] = beyond
    # A tied head's gradient comes beside the bucket: its line is what it adds beyond the bucket's.
    beside = 0 if to_boundary else sum(buckets.values())
    if tied and (
        extra := beyond_activations_after_head(act.items, allocated=beside + tied)
        - beyond_activations_after_head(act.items, allocated=beside)
    ):
        lines[TIED_HEAD_GRADIENT] = extra
    return lines


def _at_backward_end(
    case: MemoryCase, held: HeldStates, buckets: dict[str, int], *, tied: int, accum_steps: int
) -> int:
    """No pipeline: what is live beside the gradients as backward ends, after the activations are freed.

    The buckets and the tied weight's gradients joining (ZeRO 0-2); ZeRO-0's flat copy comes
    after, at the boundary.
    """
    bucketed = sum(buckets.values())
    at_end = bucketed + tied_gradient_join_bytes(
        tied, zero_stage=case.spec.zero_stage, accum_steps=accum_steps
    )
    if case.spec.zero_stage is ZeroStage.zero2 and accum_steps == 1 and case.reduce_bucket_size >= held.local:
        # A bucket that takes every gradient reduces none before backward ends: ZeRO-2's
        # gradient partition (stage_1_and_2.py ``copy_grads_in_partition``) is made after.
        at_end = max(bucketed, at_end - held.grads)
    return at_end


def _single_stage_lines(
    case: MemoryCase, held: HeldStates, act: _Activations, *, accum_steps: int
) -> tuple[dict[str, int], int]:
    """No pipeline: the residual lines live in backward or at its end, and the gradient bytes made
    after the activation peak (grads_after_activation_peak)."""
    buckets = _backward_buckets(case)
    flat = _flat_bytes(case, held)
    tied = tied_head_gradient_bytes(case.model, tp=case.spec.tp, pp=case.spec.pp, precision=case.precision)
    lines = _in_backward_lines(case, act, buckets, tied=tied, accum_steps=accum_steps)
    in_backward = sum(lines.values())
    if (beyond := flat - act.peak - in_backward) > 0:
        lines[ALLREDUCE_FLAT] = beyond
    at_end = _at_backward_end(case, held, buckets, tied=tied, accum_steps=accum_steps)
    counted = act.peak + in_backward + lines.get(ALLREDUCE_FLAT, 0)
    if at_end > max(flat, counted):
        lines[TIED_GRADIENT_JOIN] = at_end - counted
    after_peak = grads_after_activation_peak(
        held.grads,
        at_activation_peak=act.peak + in_backward,
        at_backward_end=max(at_end, flat),
        zero_stage=case.spec.zero_stage,
        accum_steps=accum_steps,
    )
    return lines, after_peak


def _pipeline_lines(
    case: MemoryCase, held: HeldStates, act: _Activations, *, accum_steps: int
) -> tuple[dict[str, int], int]:
    """Under a pipeline: the residual lines of the fullest stage, and the gradient bytes made after its
    activation peak (first_stage_grads_after_peak)."""
    lines: dict[str, int] = {}
    if (beyond := _flat_bytes(case, held) - act.peak) > 0:
        lines[ALLREDUCE_FLAT] = beyond
    first, last = pipeline_stage_bytes(
        act.items,
        pp=case.spec.pp,
        accum_steps=accum_steps,
        stage_input=act.stage_input,
        block_backward=act.block_backward,
    )
    # bf16 at stage 0 under a pipeline is DeepSpeed's BF16_Optimizer (runner/engine/optimizer_wrapper.py).
    # It allocates its flat gradient buffer (the ``grads`` term) at construction
    # (bf16_optimizer.py ``_setup_for_real_optimizer``), so the first stage's first backward
    # has it whole, and adds the parameters' own bf16 gradients into it after each backward
    # (``update_hp_grads``), keeping them: from the second backward on both are live. fp16 at
    # stage 0, whose wrapper is FP16_UnfusedOptimizer, is given the same lines here.
    wrapper = optimizer_wrapper(precision=case.precision, zero_stage=case.spec.zero_stage, pp=case.spec.pp)
    stage0_16bit = wrapper in (OptimizerWrapper.bf16_optimizer, OptimizerWrapper.fp16_unfused_optimizer)
    after_peak = 0
    if first >= last and not stage0_16bit:
        after_peak = first_stage_grads_after_peak(
            act.items, grads=held.grads, pp=case.spec.pp, accum_steps=accum_steps
        )
    # The first stage peaks at its first backward with m <= p micro-batches a step, the
    # last at any. Measured (tiny, 2 stages): m = 2 0.997 and m = 4 1.001 of the
    # allocator's peak (were 0.956 and 0.962 discounting the buffer, without this line).
    if stage0_16bit and (accum_steps > case.spec.pp if first >= last else accum_steps > 1):
        lines[BF16_PARAM_GRADS] = held.grads
    # Under a pipeline ZeRO-1 allocates the bucket at the first backward too, and keeps it
    # to the step's boundary, where reduce_gradients(pipeline_parallel=True) allocates one
    # more (stage_1_and_2.py), after the micro-batches' activations are freed. Seen with
    # allocator events on gpt2_124m's last stage (micro 4, seq 128, accum 4): 0.49 GB
    # more after the first backward, to the boundary, and 0.49 GB more there.
    buckets = _backward_buckets(case)
    if case.spec.zero_stage is ZeroStage.zero1 and buckets:
        lines.update(buckets)
        if (beyond := case.bytes_per_elem * case.reduce_bucket_size - act.peak) > 0:
            lines["reduce_bucket (at boundary)"] = beyond
    return lines, after_peak


def _backward_buckets(case: MemoryCase) -> dict[str, int]:
    """ZeRO-1/2's gradient buckets, allocated in backward (runner.memory_model.zero12_backward_buckets)."""
    return zero12_backward_buckets(
        zero_stage=case.spec.zero_stage,
        precision=case.precision,
        offload=case.spec.offload,
        reduce_bucket_size=case.reduce_bucket_size,
        overlap_comm=case.spec.overlap_comm,
        contiguous_gradients=case.spec.contiguous_gradients,
    )


def _flat_bytes(case: MemoryCase, held: HeldStates) -> int:
    """ZeRO-0 all-reduces its gradients through one flat copy of them (allreduce_flat_bytes); 0 otherwise."""
    if case.spec.zero_stage is not ZeroStage.ddp or not held.grads:
        return 0
    return allreduce_flat_bytes(held.local, largest=held.largest, precision=case.precision)


def _step_bytes(case: MemoryCase, held: HeldStates, residuals: dict[str, int]) -> int:
    """Device bytes inside the optimizer step (optimizer_step_bytes beside what lives through it); 0: none."""
    copies = optimizer_step_bytes(
        held.local,
        zero_stage=case.spec.zero_stage,
        dp=case.zero_ranks,
        precision=case.precision,
        offload=case.spec.offload,
        pp=case.spec.pp,
    )
    if not copies:
        return 0
    through = sum(size for name, size in residuals.items() if name in THROUGH_THE_STEP)
    return held.textbook.params + held.grads + held.textbook.optimizer + through + copies


def _build_bytes(case: MemoryCase) -> int:
    """Device bytes while the model is built, where it can hold more than the steady terms; 0: not there.

    zero.Init puts the partitions on the device unless parameters are offloaded; on CPU
    ranks the build is host memory (runner/plan/host.py).
    """
    tp_zero3 = case.spec.zero_stage.shards_parameters and case.spec.tp > 1 and case.spec.pp == 1
    if not tp_zero3 or case.host_is_device or case.spec.offload == OffloadPlacement.optimizer_and_params:
        return 0
    return zero3_tp_build_bytes(case.model, precision=case.precision, dp=case.zero_ranks)


def memory_terms(case: MemoryCase) -> MemoryTerms:
    """Every memory term of one device for this layout (see the module docstring)."""
    if case.accum_steps is None:
        raise ValueError(
            "memory_terms needs accum_steps: the plan's peaks depend on the micro-batches a step"
        )
    accum_steps = case.accum_steps
    held = held_states(case)
    act = _activations(case, held.block, accum_steps)
    step_lines = _single_stage_lines if case.spec.pp == 1 else _pipeline_lines
    lines, grads_after_peak = step_lines(case, held, act, accum_steps=accum_steps)
    residuals = {**held.residuals, **lines}
    return MemoryTerms(
        params=held.textbook.params,
        grads=held.grads,
        optimizer=held.textbook.optimizer,
        activations=act.peak,
        residuals=residuals,
        host={**held.host, **_offloaded_activations(case, held.block)},
        host_counts_on_device=case.host_is_device,
        activation_note=act.note,
        build=_build_bytes(case),
        grads_after_peak=grads_after_peak,
        step=_step_bytes(case, held, residuals),
    )


__all__ = ["OFFLOADED_ACTIVATIONS", "MemoryTerms", "memory_terms"]
