"""Per-device memory of one layout: the four terms, DeepSpeed's named residuals, and the host side.

Pure arithmetic over runner.memory (bytes in, bytes out; nothing is allocated). What a
layout changes:

- tensor parallel t and pipeline parallel p split the parameters, counted tensor by
  tensor for the fullest rank (runner/parallel/pipeline_split.py ``rank_param_numels``): t splits
  every block matrix, and the embedding and output head by vocabulary, while the norms
  stay whole on every rank (runner/parallel/tensor.py); p gives each stage its blocks,
  the first stage the embedding and the last the final norm and the output head (a tied
  embedding counts on both). ZeRO then shards that over dp (runner.memory.model_states),
  ZeRO-1/2 gradients as the fullest data-parallel rank holds them
  (runner.memory.zero12_held_elements).
- t splits the per-head and MLP-hidden activations (Korthikanti et al. 2022, arXiv
  2205.05198, eq. 2; runner.memory.BlockShape takes ``tp``).
- p gives each stage ceil(L / p) layers. Under the 1F1B schedule the first stage holds
  the activations of min(p, accum) micro-batches in flight (Narayanan et al. 2021,
  arXiv 2104.04473, Sec. 2.2.1: "at most p outstanding forward passes"); the last stage
  holds one, plus the loss and logits; DeepSpeed's pipeline buffers add the logits and the
  received inputs of the micro-batches they keep, and the buffers activations and gradients
  arrive in (``activation_bytes``). The plan takes the larger of the two stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.config import (
    ModelConfig,
    Offload,
    OffloadPlacement,
    OptimizerName,
    Precision,
    Recompute,
    ZeroStage,
)
from runner.memory import (
    TRANSIENT_ITEMS,
    BlockShape,
    ModelStates,
    activation_items_total,
    after_the_head,
    block_graph,
    deepspeed_residuals,
    model_block_shape,
    model_states,
    offload_host_buffers,
    transient_peak,
    zero12_backward_buckets,
    zero12_held_elements,
)
from runner.model.shape import embedding_numels
from runner.parallel.pipeline_split import rank_param_numels

TIED_HEAD_GRADIENT = "tied head grad (in backward)"
ALLREDUCE_FLAT = "allreduce_flat (at boundary)"
TIED_GRADIENT_JOIN = "tied grads joining (at backward end)"
BF16_PARAM_GRADS = "bf16 param grads (BF16_Optimizer)"
ALLREDUCE_FLAT_ELEMENTS = 500_000_000  # DeepSpeed 0.19.8 engine.py MEMORY_OPT_ALLREDUCE_SIZE
SUB_GROUP_ELEMENTS = 1_000_000_000  # DeepSpeed 0.19.8 zero/config.py sub_group_size's default (ZeRO-3)
OPTIMIZER_STEP = "optimizer step (fp32 copies of the gradients)"
# The residual lines that live through the optimizer step; the others come and go in
# backward or at its boundary, before the step (runner.memory.deepspeed_residuals).
THROUGH_THE_STEP = (
    "zero3_full_params (persistent or gathered)",
    "ipg_buckets",
    "fp32_master_copy",
    "temp_grad_buffer_for_gpu_offload",
)


@dataclass(frozen=True)
class MemoryTerms:
    """Bytes per device of each term of one layout at one micro-batch size."""

    params: int
    grads: int
    optimizer: int
    activations: int
    residuals: dict[str, int] = field(default_factory=dict)  # runner.memory.deepspeed_residuals
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


def zero3_tp_build_bytes(model: ModelConfig, *, precision: Precision | str, dp: int) -> int:
    """Device bytes of a ZeRO-3 tensor-parallel rank while its model is built (runner/engine/zero_init.py).

    zero.Init partitions the whole model over the rank's data-parallel group, in the model
    dtype on the device; DeepSpeed's AutoTP then gathers one weight at a time whole
    (DeepSpeed 0.19.8 module_inject/auto_tp.py ``_gather_zero3_params``) and keeps this
    rank's shard of it. So the build holds ceil(P / dp) elements plus the largest weight
    whole, before the rank's own share is 1/tp of the matrices and the vocabulary.
    """
    numels = rank_param_numels(model)
    elem = 4 if precision == Precision.fp32 else 2
    return elem * (-(-sum(numels) // dp) + max(numels))


def layers_per_stage(n_layer: int, pp: int) -> int:
    """Transformer layers on the fullest pipeline stage: ceil(L / pp)."""
    return -(-n_layer // pp)


def activation_bytes(
    items: dict[str, int], *, pp: int, accum_steps: int, stage_input: int = 0, block_backward: int = 0
) -> tuple[int, str]:
    """Peak activation bytes on the fullest device, and a note saying which stage and why.

    ``items``: runner.memory.activation_items_total of one stage's layers (layers_per_stage).
    Under a pipeline, ``stage_input`` and ``block_backward`` as in :func:`pipeline_stage_bytes`.
    """
    if pp == 1:
        kept = sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)
        return kept + transient_peak(items), ""  # runner.memory.activations_total
    first, last = pipeline_stage_bytes(
        items, pp=pp, accum_steps=accum_steps, stage_input=stage_input, block_backward=block_backward
    )
    if first >= last:
        return first, f"first stage, {min(pp, accum_steps)} micro-batches in flight (1F1B)"
    return last, "last stage (loss and logits)"


def pipeline_stage_bytes(
    items: dict[str, int], *, pp: int, accum_steps: int, stage_input: int, block_backward: int
) -> tuple[int, int]:
    """Peak activation bytes of a pipeline's first and last stage.

    ``stage_input``: one micro-batch's hidden states as they pass between stages (b x s x h
    in the compute dtype). ``block_backward``: what a block's backward holds beside the
    saved tensors (:func:`mlp_backward_bytes`).
    """
    recompute_set = items["transient.recompute_layer"]
    kept = sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)
    # Narayanan et al. 2021 (arXiv 2104.04473), Sec. 2.2.1: 1F1B keeps at most p
    # micro-batches in flight on the first stage (and never more than the m = accum).
    # Its peak comes inside a block's backward (the loss is on the other stage), with that
    # block's gradient working set on top (measured: 0.937 of the allocator's peak without
    # it, tiny, m = 4), and the one buffer the next stage's gradients arrive in (DeepSpeed
    # 0.19.8 pipe/engine.py ``_recv_tensor_meta``/``_allocate_zeros``).
    first = min(pp, accum_steps) * (items["blocks"] + items["embedding.token_ids"]) + recompute_set
    first += block_backward + stage_input
    # The last stage keeps two pipeline buffers (pipe/schedule.py TrainSchedule
    # ``num_pipe_buffers``: max(2, ...)), of which m use at most two. Each keeps its
    # micro-batch's logits (``_exec_forward_pass``: pipe_buffers['outputs'], never freed on
    # the last stage) and its received input (``_exec_recv_activations``: a clone of the
    # receive buffer, which is kept too). So at the loss's backward the current logits and,
    # with m >= 2, the previous micro-batch's are both live. Measured (one CPU rank's
    # allocator events at the last stage's peak, fp32, V = 3000, h = 256, micro 8, seq 128,
    # m = 2 and 4): five V-wide tensors (two buffers' logits, the log-probabilities, the two
    # loss gradients) and three h-wide ones beside the blocks.
    buffers = min(2, accum_steps)
    last = kept + transient_peak(items)
    last += buffers * items["transient.logits"] + (1 + buffers) * stage_input
    return first, last


def first_stage_grads_after_peak(items: dict[str, int], *, grads: int, pp: int, accum_steps: int) -> int:
    """Gradient bytes not yet made at a pipeline's first-stage peak: the sum of terms counts them twice.

    With m <= p micro-batches a step, 1F1B's first backward on the first stage comes with
    all m in flight, before the step has made any gradient (ZeRO 0-1 start each step
    without them); at each later backward the gradients are whole and one micro-batch
    fewer is in flight. The stage peaks at the larger of the two. Measured (tiny, fp32,
    m = 2 on 2 stages): 1.052 of the allocator's peak counting both whole.
    """
    if accum_steps > pp:
        return 0
    return min(grads, items["blocks"] + items["embedding.token_ids"])


def mlp_backward_bytes(block: BlockShape) -> int:
    """Bytes a SwiGLU MLP's backward holds at once: three b x s x f/t tensors in the compute dtype.

    runner/model/transformer.py FeedForward, w2(silu(w1 x) * w3 x): the gradient of w2's input, then the
    product's two input gradients (one per factor) made from it, before any is freed.
    """
    ffn = block.ffn_hidden or 4 * block.d_model
    return 3 * block.bytes_per_elem * block.micro_size * block.seq_len * ffn // block.tp


def beyond_activations_after_head(items: dict[str, int], *, allocated: int) -> int:
    """Bytes that tensors allocated at the output head's backward add to the activation peak.

    No pipeline. ``items``: runner.memory.activation_items_total. After the output head's
    backward the loss's tensors (its saved log-probabilities or exponentials, its gradients)
    are freed, and backward's recompute working set is not live yet; what is allocated
    there and held on adds to the kept activations less the loss's, and peaks with the final
    norm's backward (``transient.final_norm_backward``). The step peaks at the larger of that
    and the activation peak. Two things come there: ZeRO 1-2's gradient bucket, at the first
    parameter gradient (runner.memory.zero12_backward_buckets; ZeRO-2 frees it as each
    backward ends, ZeRO-1 without accumulation too; ZeRO-1 with accumulation keeps it to the
    step's boundary, where the whole of it adds: memory_terms), and a tied output head's
    weight gradient (:func:`tied_head_gradient_bytes`).

    Measured as the allocator's high-water mark (bench/step_peak.py: torch.profiler memory
    events from the build to two steps' end, one CPU rank, micro 8, seq 128, accum 1 and 2),
    planned over measured at ZeRO 1-2: tiny 0.989-0.998 in bf16 and 0.992-0.996 in fp32,
    gpt2_124m 0.998-1.000 in both (its loss frees 0.62 GB in fp32, more than its 0.49 GB
    bucket alone, but not more than the bucket and its tied head's 0.15 GB gradient). Without
    the final norm's working set tiny's bf16 ZeRO-1 and -2 at one micro-batch were at 0.959.
    """
    return max(0, after_the_head(items) + allocated - transient_peak(items))


def tied_head_gradient_bytes(model: ModelConfig, *, tp: int, pp: int, precision: Precision | str) -> int:
    """Bytes of a tied output head's weight gradient, held through backward (no pipeline).

    The output head and the embedding share one weight (``tie_embeddings``). Autograd gets
    the head's gradient of it (V x h in the model dtype; ceil(V / t) x h under tensor
    parallelism, split by vocabulary) at the head's backward, first in backward, and holds
    it in the weight's input buffer until the embedding's joins it, last in backward; only
    then does the summed gradient reach the parameter (and DeepSpeed's hooks). Under a
    pipeline the two ends are separate copies on the first and last stages (DeepSpeed's
    TiedLayerSpec), summed by an all-reduce after backward: nothing is held.
    """
    if not model.tie_embeddings or pp > 1:
        return 0
    _, head = embedding_numels(model, tp)
    return (4 if precision == Precision.fp32 else 2) * head


def tied_gradient_join_bytes(tied: int, *, zero_stage: ZeroStage | int, accum_steps: int) -> int:
    """Bytes a tied weight's two gradients make as they join, last in backward, beyond the gradients.

    ``tied``: :func:`tied_head_gradient_bytes`. At the embedding's backward autograd holds the
    head's gradient of the weight, makes the embedding's (dense, V x h) and adds the two.
    ZeRO 0-1 keep every parameter's gradient whole to the end of backward (ZeRO-1 its bucket
    too), the head's held gradient standing for the weight's until the sum replaces it: two
    V x h tensors beyond the gradients. With accumulation the weight's gradient of the
    earlier micro-batches is there too, and under ZeRO-2 its slot in the gradient partition:
    three. Measured as the allocator's peak (bench/step_peak.py, fp32, one CPU rank, the peak
    at the embedding's backward): gpt2_124m at micro 1, seq 16, and a 2-layer model with
    V = 32000, h = 512 at micro 4, seq 64. Without them ZeRO-1 planned 0.906 and 0.914 of
    gpt2_124m's peak, ZeRO-2 0.837 and 0.856 of the 2-layer model's.
    """
    if not tied or zero_stage > 2:
        return 0
    return tied * (2 if zero_stage < 2 and accum_steps == 1 else 3)


def allreduce_flat_bytes(local: int, *, largest: int, precision: Precision | str) -> int:
    """Bytes of the flat copy ZeRO-0 all-reduces its gradients through at the boundary.

    DeepSpeed 0.19.8 engine.py ``allreduce_no_retain`` gathers gradients until they pass
    ``MEMORY_OPT_ALLREDUCE_SIZE`` (5e8) elements and ``allreduce_bucket`` flattens them
    into one tensor (``torch.cat``) for the all-reduce, at any dp, 1 included: the whole
    gradient of a rank up to 5e8 elements and one tensor, in the gradient dtype. It comes
    after backward, when the micro-batches' activations are freed.
    """
    return (4 if precision == Precision.fp32 else 2) * min(local, ALLREDUCE_FLAT_ELEMENTS + largest)


def optimizer_step_bytes(
    local: int,
    *,
    zero_stage: ZeroStage | int,
    dp: int,
    precision: Precision | str,
    offload: OffloadPlacement | str,
    pp: int,
) -> int:
    """Device bytes the optimizer step adds while it runs: the gradients copied for an fp32 optimizer.

    Backward's activations are freed by then; the model states and these copies are live
    (DeepSpeed 0.19.8):

    - ZeRO 1-2 (stage_1_and_2.py ``step``): each group's gradient partition written into
      one new fp32 tensor, 4 B per element of the partition. In 16-bit DeepSpeed flattens it
      in its own dtype first and casts that (g + 4 B live at the cast); ladder writes the
      fp32 tensor in one pass (runner/engine/zero_step_copies.py).
    - ZeRO-3 (stage3.py ``_prepare_fp32_grad_for_sub_group``): the same, one sub-group at a
      time, at most ``sub_group_size`` (1e9) elements.
    - ZeRO-0 in 16-bit (FP16_UnfusedOptimizer ``step``, bf16 and fp16): an fp32 copy of every
      gradient before the step, 4 B per parameter. Under a pipeline bf16 steps through
      BF16_Optimizer (bf16_optimizer.py ``step``): its flat gradient buffer, in bf16 (the
      grads term; DeepSpeed's grad_accum_dtype is the model's), cast to fp32, 4 B, beside
      the parameters' own bf16 gradients it keeps to the step, 2 B.
      fp32: torch's fused AdamW steps in place: none.
    - An offloaded optimizer steps on the host: none on the device.

    Measured with bench/step_peak.py (tiny, bf16, micro 1, seq 16, where the step outgrows
    backward): ZeRO-1 and -2 peak at 20.2 B per parameter (2 + 2 + 12 of the states, 4 of
    these; 22.07 with DeepSpeed's 16-bit flat copy), ZeRO-0 at 20.1 (16 + 4), ZeRO-3 at 22.2
    (18 with its bucket + 4; 24.5 with the flat copy), a pipeline's bf16 stage 0 at 22.2
    (16 + 6); before this term the plan was 10-24% short there. A large model on few
    devices peaks here: llama_7b under ZeRO-1 on one device holds 20 x 6.74e9 B = 135 GB
    at its step.
    """
    if offload != OffloadPlacement.none:
        return 0
    partition = -(-local // dp)
    if zero_stage in (1, 2):
        return 4 * partition  # the fp32 partition, written in one pass
    if zero_stage == 3:
        return 4 * min(partition, SUB_GROUP_ELEMENTS)
    if precision == Precision.fp32:
        return 0
    return (4 + 2) * local if pp > 1 and precision == Precision.bf16 else 4 * local


def grads_after_activation_peak(
    grads: int,
    *,
    at_activation_peak: int,
    at_backward_end: int,
    zero_stage: ZeroStage | int,
    accum_steps: int,
) -> int:
    """Gradient bytes that are not yet made at the activation peak: the sum of terms counts them twice.

    At one micro-batch per step (no pipeline) ZeRO 0-2 start each step without gradients:
    stage 0 sets them to None after the step, ZeRO 1-2 free their gradient partitions. So
    backward makes them layer by layer as it frees the activations, after the loss, where
    the activations peak, and the step peaks at the larger of the activation peak (with what
    backward adds there: ``at_activation_peak``) and the gradients with what is live beside
    them as backward ends (``at_backward_end``: ZeRO 1-2's buckets, a tied weight's gradients
    joining, ZeRO-0's flat all-reduce copy), which the terms count as max(at_activation_peak,
    at_backward_end). ZeRO-3 keeps
    its gradient partitions from step to step, and with accumulation the first micro-batch's
    gradients are live at the next one's loss: both count whole.

    Measured as the allocator's peak from build to two steps' end (bench/step_peak.py, fp32,
    micro 8, seq 128, one CPU rank), planned against measured: gpt2_124m at ZeRO-0 with one
    micro-batch per step 2.928 against 2.929 GB (3.422 counting its 0.49 GB of gradients
    whole), ZeRO-2 3.454 against 3.464 (3.948); tiny in bf16 at ZeRO-0 0.100 against 0.102.
    """
    if accum_steps > 1 or zero_stage == 3:
        return 0
    peak_a, end = at_activation_peak, at_backward_end
    return grads + max(peak_a, end) - max(peak_a, grads + end)


def offload_placement(offload_optimizer: Offload, offload_param: Offload) -> OffloadPlacement:
    """The config's two offload switches as one placement: none, optimizer, or optimizer+params.

    DeepSpeed offloads parameters only beside the optimizer (ZeRO-Infinity's CPU layout);
    parameters alone are refused (ValueError).
    """
    if offload_param == Offload.cpu and offload_optimizer != Offload.cpu:
        raise ValueError(
            "parameter offload without optimizer offload is not a placement the estimators model"
        )
    if offload_param == Offload.cpu:
        return OffloadPlacement.optimizer_and_params
    return OffloadPlacement.optimizer if offload_optimizer == Offload.cpu else OffloadPlacement.none


@dataclass(frozen=True)
class MemoryCase:
    """What one device's memory depends on: the model, precision and optimizer, the ZeRO stage,
    the layout and one micro-batch size; the device is the fullest rank of that layout.

    The plan (:func:`memory_terms`, from runner/plan/planner.py ``memory_at``) and the measured
    ledger's estimate (runner/metrics/ledger.py) describe their device with it, and both take
    its model states, DeepSpeed's buffers and the host lines from :func:`held_states`.
    """

    model: ModelConfig
    precision: Precision
    optimizer: OptimizerName
    zero_stage: ZeroStage
    seq_len: int
    micro_size: int
    dp: int
    tp: int = 1
    pp: int = 1
    # Micro-batches per optimizer step. None (not known): the ledger's estimate counts the
    # offload buffer that accumulation needs; the plan needs it known.
    accum_steps: int | None = 1
    offload: OffloadPlacement = OffloadPlacement.none
    recompute: Recompute = Recompute.none
    # Elements of the gradient bucket DeepSpeed is given
    # (runner.engine.deepspeed_config.reduce_bucket_elements).
    reduce_bucket_size: int = 500_000_000
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    compiled: bool = False  # train.compile: the blocks' activations as their compiled graphs save them
    host_is_device: bool = False  # CPU ranks: the host memory is the device's
    # ZeRO-3 keeps parameters of at most this many elements whole on every rank: the threshold
    # DeepSpeed is given (runner.engine.deepspeed_config.persistence_threshold_elements); 0: none.
    param_persistence_threshold: int = 0

    def __post_init__(self) -> None:
        # The enums' plain values ("fp32", 3, "optimizer+params") are taken too, as tests and
        # notebooks write them; they are held as the members.
        for name, kind in (
            ("precision", Precision),
            ("optimizer", OptimizerName),
            ("zero_stage", ZeroStage),
            ("offload", OffloadPlacement),
            ("recompute", Recompute),
        ):
            object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def bytes_per_elem(self) -> int:
        """Bytes of one element of the model dtype: the weights, gradients and activations."""
        return 4 if self.precision == Precision.fp32 else 2


@dataclass(frozen=True)
class HeldStates:
    """The fullest rank's model states, DeepSpeed's named buffers and its host lines, and the shape
    of one block's activations: what the plan and the ledger's estimate share (:func:`held_states`)."""

    numels: list[int]  # the rank's parameter tensors (runner.parallel.pipeline_split.rank_param_numels)
    textbook: ModelStates  # ZeRO's accounting of them (runner.memory.model_states)
    grads: int  # device gradient bytes: ZeRO-1/2's whole straddling tensors, else the textbook's
    residuals: dict[str, int]  # DeepSpeed's device buffers (runner.memory.deepspeed_residuals)
    offloaded: dict[str, int]  # the terms offload puts on the host, per rank (the non-zero ones)
    host_buffers: dict[str, int]  # ZeRO-Offload's own host buffers (runner.memory.offload_host_buffers)
    block: BlockShape  # one block's activations at this micro-batch (runner.memory.model_block_shape)

    @property
    def local(self) -> int:
        """Parameters the rank holds before ZeRO partitions them."""
        return sum(self.numels)

    @property
    def largest(self) -> int:
        """Elements of the rank's largest parameter tensor."""
        return max(self.numels)

    @property
    def host(self) -> dict[str, int]:
        """Host bytes per rank: the offloaded terms, then ZeRO-Offload's buffers."""
        return {**self.offloaded, **self.host_buffers}


def held_states(case: MemoryCase) -> HeldStates:
    """The model states, DeepSpeed's buffers and the host lines of the fullest rank (see HeldStates).

    The single source of these terms: the plan (:func:`memory_terms`) adds what is live at
    the peak, the ledger's estimate (runner/metrics/ledger.py) what is held at the step's boundary.
    """
    # The fullest rank's tensors: 1/tp of the matrices and of the vocabulary, the norms whole
    # (runner/parallel/tensor.py); a pipeline rank holds its stage's layers.
    numels = rank_param_numels(case.model, tp=case.tp, pp=case.pp)
    local, largest, stage = sum(numels), max(numels), case.zero_stage
    states = model_states(
        local,
        zero_stage=stage,
        dp=case.dp,
        precision=case.precision,
        optimizer=case.optimizer,
        offload=case.offload,
    )
    grads, held = states.grads, None
    if stage in (1, 2):
        # ZeRO-1/2 keep whole the gradient of every tensor a rank's partition touches: the
        # fullest rank holds up to two straddling tensors beyond P/dp (exact, tensor by tensor).
        held = zero12_held_elements(numels, case.dp)
        if case.offload == OffloadPlacement.none:
            grads = case.bytes_per_elem * held
    # DeepSpeed keeps a tensor whole when ``ds_numel <= threshold`` (0.19.8 parameter_offload.py
    # ``mark_persistent_parameters``): a tensor of exactly the threshold is kept.
    persistent = sum(n for n in numels if n <= case.param_persistence_threshold) if stage == 3 else 0
    offloaded = {
        "params": states.host_params,
        "grads": states.host_grads,
        "optimizer": states.host_optimizer,
    }
    return HeldStates(
        numels=numels,
        textbook=states,
        grads=grads,
        residuals=deepspeed_residuals(
            local,
            zero_stage=stage,
            dp=case.dp,
            precision=case.precision,
            optimizer=case.optimizer,
            offload=case.offload,
            reduce_bucket_size=case.reduce_bucket_size,
            persistent_params=persistent,
            largest_param=largest,
        ),
        offloaded={name: value for name, value in offloaded.items() if value},
        host_buffers=offload_host_buffers(
            local,
            zero_stage=stage,
            dp=case.dp,
            precision=case.precision,
            optimizer=case.optimizer,
            offload=case.offload,
            largest_param=largest,
            held_params=held,
            accum_steps=case.accum_steps,
        ),
        block=model_block_shape(
            case.model,
            seq_len=case.seq_len,
            micro_size=case.micro_size,
            tp=case.tp,
            bytes_per_elem=case.bytes_per_elem,
            graph=block_graph(case.compiled, tp=case.tp, zero_stage=stage),
        ),
    )


@dataclass(frozen=True)
class _Activations:
    """One stage's activation items, its peak activation bytes (activation_bytes) and what they rest on."""

    items: dict[str, int]  # runner.memory.activation_items_total of the fullest stage's layers
    peak: int
    note: str
    stage_input: int  # one micro-batch's hidden states between stages (pipeline_stage_bytes)
    block_backward: int  # mlp_backward_bytes


def _activations(case: MemoryCase, block: BlockShape, accum_steps: int) -> _Activations:
    """The fullest stage's activation items and peak at this micro-batch."""
    items = activation_items_total(
        block,
        n_layers=layers_per_stage(case.model.n_layer, case.pp),
        vocab_size=case.model.vocab_size,
        recompute=case.recompute,
    )
    stage_input = block.bytes_per_elem * case.micro_size * case.seq_len * case.model.d_model
    block_backward = mlp_backward_bytes(block)
    peak, note = activation_bytes(
        items, pp=case.pp, accum_steps=accum_steps, stage_input=stage_input, block_backward=block_backward
    )
    if block.graph != "eager":
        how = "compiled blocks" if block.graph == "whole" else "compiled blocks, split at collectives"
        note = f"{how}; {note}" if note else how
    return _Activations(items, peak, note, stage_input, block_backward)


def _in_backward_lines(
    case: MemoryCase, act: _Activations, buckets: dict[str, int], *, tied: int, accum_steps: int
) -> dict[str, int]:
    """No pipeline: ZeRO-1/2's buckets and a tied head's gradient, what they add to the activation peak."""
    lines: dict[str, int] = {}
    # ZeRO-1 reduces at the step's boundary only: the bucket its first micro-batch
    # allocates stays until then, live at every later micro-batch's loss: all of it adds.
    to_boundary = case.zero_stage == 1 and accum_steps > 1
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
    at_end = bucketed + tied_gradient_join_bytes(tied, zero_stage=case.zero_stage, accum_steps=accum_steps)
    if case.zero_stage == 2 and accum_steps == 1 and case.reduce_bucket_size >= held.local:
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
    tied = tied_head_gradient_bytes(case.model, tp=case.tp, pp=case.pp, precision=case.precision)
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
        zero_stage=case.zero_stage,
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
        pp=case.pp,
        accum_steps=accum_steps,
        stage_input=act.stage_input,
        block_backward=act.block_backward,
    )
    # bf16 at stage 0 under a pipeline is DeepSpeed's BF16_Optimizer (engine.py
    # ``_do_optimizer_sanity_check``: BFLOAT16 with pipeline_parallelism). It allocates its
    # flat gradient buffer (the ``grads`` term) at construction (bf16_optimizer.py
    # ``_setup_for_real_optimizer``), so the first stage's first backward has it whole,
    # and adds the parameters' own bf16 gradients into it after each backward
    # (``update_hp_grads``), keeping them: from the second backward on both are live.
    bf16_stage0 = case.zero_stage == ZeroStage.ddp and case.precision != Precision.fp32
    after_peak = 0
    if first >= last and not bf16_stage0:
        after_peak = first_stage_grads_after_peak(
            act.items, grads=held.grads, pp=case.pp, accum_steps=accum_steps
        )
    # The first stage peaks at its first backward with m <= p micro-batches a step, the
    # last at any. Measured (tiny, 2 stages): m = 2 0.997 and m = 4 1.001 of the
    # allocator's peak (were 0.956 and 0.962 discounting the buffer, without this line).
    if bf16_stage0 and (accum_steps > case.pp if first >= last else accum_steps > 1):
        lines[BF16_PARAM_GRADS] = held.grads
    # Under a pipeline ZeRO-1 allocates the bucket at the first backward too, and keeps it
    # to the step's boundary, where reduce_gradients(pipeline_parallel=True) allocates one
    # more (stage_1_and_2.py), after the micro-batches' activations are freed. Seen with
    # allocator events on gpt2_124m's last stage (micro 4, seq 128, accum 4): 0.49 GB
    # more after the first backward, to the boundary, and 0.49 GB more there.
    buckets = _backward_buckets(case)
    if case.zero_stage == 1 and buckets:
        lines.update(buckets)
        if (beyond := case.bytes_per_elem * case.reduce_bucket_size - act.peak) > 0:
            lines["reduce_bucket (at boundary)"] = beyond
    return lines, after_peak


def _backward_buckets(case: MemoryCase) -> dict[str, int]:
    """ZeRO-1/2's gradient buckets, allocated in backward (runner.memory.zero12_backward_buckets)."""
    return zero12_backward_buckets(
        zero_stage=case.zero_stage,
        precision=case.precision,
        offload=case.offload,
        reduce_bucket_size=case.reduce_bucket_size,
        overlap_comm=case.overlap_comm,
        contiguous_gradients=case.contiguous_gradients,
    )


def _flat_bytes(case: MemoryCase, held: HeldStates) -> int:
    """ZeRO-0 all-reduces its gradients through one flat copy of them (allreduce_flat_bytes); 0 otherwise."""
    if case.zero_stage != 0 or not held.grads:
        return 0
    return allreduce_flat_bytes(held.local, largest=held.largest, precision=case.precision)


def _step_bytes(case: MemoryCase, held: HeldStates, residuals: dict[str, int]) -> int:
    """Device bytes inside the optimizer step (optimizer_step_bytes beside what lives through it); 0: none."""
    copies = optimizer_step_bytes(
        held.local,
        zero_stage=case.zero_stage,
        dp=case.dp,
        precision=case.precision,
        offload=case.offload,
        pp=case.pp,
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
    tp_zero3 = case.zero_stage == 3 and case.tp > 1 and case.pp == 1
    if not tp_zero3 or case.host_is_device or case.offload == OffloadPlacement.optimizer_and_params:
        return 0
    return zero3_tp_build_bytes(case.model, precision=case.precision, dp=case.dp)


def memory_terms(case: MemoryCase) -> MemoryTerms:
    """Every memory term of one device for this layout (see the module docstring)."""
    if case.accum_steps is None:
        raise ValueError(
            "memory_terms needs accum_steps: the plan's peaks depend on the micro-batches a step"
        )
    accum_steps = case.accum_steps
    held = held_states(case)
    act = _activations(case, held.block, accum_steps)
    step_lines = _single_stage_lines if case.pp == 1 else _pipeline_lines
    lines, grads_after_peak = step_lines(case, held, act, accum_steps=accum_steps)
    residuals = {**held.residuals, **lines}
    return MemoryTerms(
        params=held.textbook.params,
        grads=held.grads,
        optimizer=held.textbook.optimizer,
        activations=act.peak,
        residuals=residuals,
        host=held.host,
        host_counts_on_device=case.host_is_device,
        activation_note=act.note,
        build=_build_bytes(case),
        grads_after_peak=grads_after_peak,
        step=_step_bytes(case, held, residuals),
    )


__all__ = [
    "ALLREDUCE_FLAT",
    "OPTIMIZER_STEP",
    "TIED_HEAD_GRADIENT",
    "HeldStates",
    "MemoryCase",
    "MemoryTerms",
    "activation_bytes",
    "allreduce_flat_bytes",
    "beyond_activations_after_head",
    "grads_after_activation_peak",
    "held_states",
    "layers_per_stage",
    "memory_terms",
    "offload_placement",
    "optimizer_step_bytes",
    "tied_head_gradient_bytes",
    "zero3_tp_build_bytes",
]
