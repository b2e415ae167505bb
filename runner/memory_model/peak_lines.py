"""The plan's peak, line by line: the formulas for what a step holds beyond the held states, each
measured against the allocator (bench/step_peak.py). runner.memory_model.peak sums them.
"""

from __future__ import annotations

from runner.config import ModelConfig, OffloadPlacement, Precision, ZeroStage
from runner.engine.optimizer_wrapper import OptimizerWrapper, optimizer_wrapper
from runner.memory_model.activations import TRANSIENT_ITEMS, BlockShape, after_the_head, transient_peak
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
# backward or at its boundary, before the step (runner.memory_model.deepspeed_residuals).
THROUGH_THE_STEP = (
    "zero3_full_params (persistent or gathered)",
    "ipg_buckets",
    "fp32_master_copy",
    "temp_grad_buffer_for_gpu_offload",
)


def zero3_tp_build_bytes(model: ModelConfig, *, precision: Precision | str, dp: int) -> int:
    """Device bytes of a ZeRO-3 tensor-parallel rank while its model is built (runner/engine/zero_init.py).

    zero.Init partitions the whole model over the rank's data-parallel group, in the model
    dtype on the device; DeepSpeed's AutoTP then gathers one weight at a time whole
    (DeepSpeed 0.19.8 module_inject/auto_tp.py ``_gather_zero3_params``) and keeps this
    rank's shard of it. So the build holds ceil(P / dp) elements plus the largest weight
    whole, before the rank's own share is 1/tp of the matrices and the vocabulary.
    """
    numels = rank_param_numels(model)
    elem = Precision(precision).bytes
    return elem * (-(-sum(numels) // dp) + max(numels))


def layers_per_stage(n_layer: int, pp: int) -> int:
    """Transformer layers on the fullest pipeline stage: ceil(L / pp)."""
    return -(-n_layer // pp)


def activation_bytes(
    items: dict[str, int], *, pp: int, accum_steps: int, stage_input: int = 0, block_backward: int = 0
) -> tuple[int, str]:
    """Peak activation bytes on the fullest device, and a note saying which stage and why.

    ``items``: runner.memory_model.activation_items_total of one stage's layers (layers_per_stage).
    Under a pipeline, ``stage_input`` and ``block_backward`` as in :func:`pipeline_stage_bytes`.
    """
    if pp == 1:
        kept = sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)
        return kept + transient_peak(items), ""  # runner.memory_model.activations_total
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
    product's two input gradients (one per factor) made from it, before any is freed. With the MLP
    in pieces (``block.mlp_tiles``) these are one piece's: b x s becomes ``block.mlp_piece`` tokens.
    """
    return 3 * block.bytes_per_elem * block.mlp_piece * block.local_ffn


def beyond_activations_after_head(items: dict[str, int], *, allocated: int) -> int:
    """Bytes that tensors allocated at the output head's backward add to the activation peak.

    No pipeline. ``items``: runner.memory_model.activation_items_total. After the output head's
    backward the loss's tensors (its saved log-probabilities or exponentials, its gradients)
    are freed, and backward's recompute working set is not live yet; what is allocated
    there and held on adds to the kept activations less the loss's, and peaks with the final
    norm's backward (``transient.final_norm_backward``). The step peaks at the larger of that
    and the activation peak. Two things come there: ZeRO 1-2's gradient bucket, at the first
    parameter gradient (runner.memory_model.zero12_backward_buckets; ZeRO-2 frees it as each
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
    return Precision(precision).bytes * head


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
    stage = ZeroStage(zero_stage)
    if not tied or stage.shards_parameters:
        return 0
    return tied * (2 if not stage.shards_gradients and accum_steps == 1 else 3)


def allreduce_flat_bytes(local: int, *, largest: int, precision: Precision | str) -> int:
    """Bytes of the flat copy ZeRO-0 all-reduces its gradients through at the boundary.

    DeepSpeed 0.19.8 engine.py ``allreduce_no_retain`` gathers gradients until they pass
    ``MEMORY_OPT_ALLREDUCE_SIZE`` (5e8) elements and ``allreduce_bucket`` flattens them
    into one tensor (``torch.cat``) for the all-reduce, at any dp, 1 included: the whole
    gradient of a rank up to 5e8 elements and one tensor, in the gradient dtype. It comes
    after backward, when the micro-batches' activations are freed.
    """
    return Precision(precision).bytes * min(local, ALLREDUCE_FLAT_ELEMENTS + largest)


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
    (DeepSpeed 0.19.8), by the optimizer's wrapper (runner/engine/optimizer_wrapper.py):

    - ZeRO 1-2 (stage_1_and_2.py ``step``): each group's gradient partition written into
      one new fp32 tensor, 4 B per element of the partition. In 16-bit DeepSpeed flattens it
      in its own dtype first and casts that (g + 4 B live at the cast); ladder writes the
      fp32 tensor in one pass (runner/engine/lean_zero_step.py).
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
    wrapper = optimizer_wrapper(precision=precision, zero_stage=zero_stage, pp=pp)
    if wrapper is OptimizerWrapper.zero_optimizer:
        return 4 * partition  # the fp32 partition, written in one pass
    if wrapper is OptimizerWrapper.zero3_optimizer:
        return 4 * min(partition, SUB_GROUP_ELEMENTS)
    if wrapper is OptimizerWrapper.none:
        return 0
    return (4 + 2) * local if wrapper is OptimizerWrapper.bf16_optimizer else 4 * local


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
    if accum_steps > 1 or ZeroStage(zero_stage) is ZeroStage.zero3:
        return 0
    peak_a, end = at_activation_peak, at_backward_end
    return grads + max(peak_a, end) - max(peak_a, grads + end)


__all__ = [
    "ALLREDUCE_FLAT",
    "ALLREDUCE_FLAT_ELEMENTS",
    "BF16_PARAM_GRADS",
    "OPTIMIZER_STEP",
    "SUB_GROUP_ELEMENTS",
    "THROUGH_THE_STEP",
    "TIED_GRADIENT_JOIN",
    "TIED_HEAD_GRADIENT",
    "activation_bytes",
    "allreduce_flat_bytes",
    "beyond_activations_after_head",
    "first_stage_grads_after_peak",
    "grads_after_activation_peak",
    "layers_per_stage",
    "mlp_backward_bytes",
    "optimizer_step_bytes",
    "pipeline_stage_bytes",
    "tied_gradient_join_bytes",
    "tied_head_gradient_bytes",
    "zero3_tp_build_bytes",
]
