"""Per-device memory estimates: model states (params, grads, optimizer) and activations, in bytes.

Pure arithmetic, bytes in and bytes out. Convert for display with ``GB`` (1e9 bytes, the
unit the ZeRO paper and the metric names ``memory/*_gb`` use) or ``GiB`` (2**30 bytes).

Two parts:

- Model states after ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054, Fig. 1 and Sec. 5),
  derived from the tensors each precision/optimizer really keeps.
- Activations after Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4.1), kept in the
  paper's form (:func:`korthikanti_activations_per_layer`) and adapted tensor by tensor to
  this project's block in ``runner/model/transformer.py`` (:func:`activations_per_layer`). The adapted
  list was checked against what autograd actually saves for that block on CPU
  (``tests/unit/test_memory.py``).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, TypeVar

from runner.config import ModelConfig, OffloadPlacement, OptimizerName, Precision, Recompute, ZeroStage

GB = 1e9  # decimal gigabyte: ZeRO's "120 GB", DESIGN.md's memory/*_gb metrics
GiB = 2**30  # binary gibibyte: what CUDA tools and device datasheets often mean by "GB"

# Precision, optimizer, offload placement, recompute mode and ZeRO stage are runner.config's
# enums; every function here takes the member or its plain value ("bf16", 3), as notebooks pass.
BlockGraph = Literal["eager", "whole", "split"]
_GRAPHS = ("eager", "whole", "split")

FP32_BYTES = 4  # IEEE single
HALF_BYTES = 2  # bf16 / fp16
INT64_BYTES = 8  # token ids and targets
BOOL_BYTES = 1  # masks


_Member = TypeVar("_Member", bound=Enum)


def _choice(value: Any, kind: type[_Member], what: str) -> _Member:
    """The member of ``kind`` (one of runner.config's enums) for a member or its plain value."""
    text = getattr(value, "value", value)
    try:
        return kind(text)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in kind)
        raise ValueError(f"{what}={text!r} is not one of {allowed}") from None


def _shard(numel: int, bytes_per_elem: int, dp: int) -> int:
    """Bytes of one rank's partition of `numel` elements over `dp` ranks (ceil: the last may pad)."""
    return -(-numel // dp) * bytes_per_elem


# --------------------------------------------------------------------------------------
# Model states
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelStates:
    """Per-device bytes of parameters, gradients and optimizer states; host bytes when offloaded."""

    params: int
    grads: int
    optimizer: int
    host_params: int = 0  # per rank, in host (CPU) memory
    host_grads: int = 0
    host_optimizer: int = 0

    @property
    def total(self) -> int:
        """Device bytes of all three terms."""
        return self.params + self.grads + self.optimizer

    @property
    def host_total(self) -> int:
        """Host bytes of all three terms, per rank (a node holds this times its ranks)."""
        return self.host_params + self.host_grads + self.host_optimizer


def bytes_per_param(precision: Precision | str, optimizer: OptimizerName | str) -> tuple[int, int, int]:
    """(weight, gradient, optimizer-state) bytes per parameter before any sharding.

    What the tensors are (ZeRO, arXiv 1910.02054, Sec. 3.1 for mixed-precision Adam):

    - bf16 / fp16 mixed precision: a 16-bit working weight (2) and its 16-bit gradient (2);
      the optimizer keeps an fp32 master weight (4) plus its fp32 state: Adam's first and
      second moments m, v (4 + 4), so 4 + 8 = 12; SGD with momentum one fp32 momentum buffer
      (4), so 4 + 4 = 8. Adam totals 2 + 2 + 12 = 16 B/param ("K = 12" in the paper).
    - fp32: the weight (4) and gradient (4) are already fp32, so there is no master copy:
      Adam keeps m, v (8), SGD with momentum one buffer (4). Adam totals 4 + 4 + 8 = 16.
    """
    prec = _choice(precision, Precision, "precision")
    opt = _choice(optimizer, OptimizerName, "optimizer")
    state = 2 * FP32_BYTES if opt == OptimizerName.adamw else FP32_BYTES  # (m, v) or momentum, fp32
    if prec == Precision.fp32:
        return FP32_BYTES, FP32_BYTES, state
    return HALF_BYTES, HALF_BYTES, FP32_BYTES + state  # + fp32 master weights


def model_states(
    num_params: int,
    *,
    zero_stage: ZeroStage | int,
    dp: int,
    precision: Precision | str = Precision.bf16,
    optimizer: OptimizerName | str = OptimizerName.adamw,
    offload: OffloadPlacement | str = OffloadPlacement.none,
) -> ModelStates:
    """Per-device bytes of parameters, gradients and optimizer states under ZeRO `zero_stage` over `dp` ranks.

    Per-parameter bytes come from :func:`bytes_per_param` (what the tensors are). ZeRO
    (arXiv 1910.02054, Fig. 1 and Sec. 5) then partitions them over the N_d = `dp`
    data-parallel ranks: stage 1 the optimizer states, stage 2 also the gradients, stage 3
    also the parameters. For mixed-precision Adam (16 B/param) this gives the paper's
    stage 0: 16P, stage 1: (4 + 12/N_d)P, stage 2: (2 + 14/N_d)P, stage 3: 16P/N_d.
    A partition is ceil(P / N_d) elements (the last rank's is padded).

    Offload (`offload`, DeepSpeed's ``offload_optimizer`` / ``offload_param`` to CPU) moves
    terms to the host; they count 0 on the device and appear in the ``host_*`` fields:

    - ``"optimizer"`` (ZeRO stages 1-3; ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840,
      Sec. 4.1: gradients, optimizer states and the update live on the CPU, the 16-bit
      parameters on the GPU): optimizer states on the host, and the gradient partition on
      the host in fp32 (DeepSpeed 0.19.8 allocates the fp32 gradient partition of its CPU
      optimizer on the offload device: ``stage_1_and_2.py`` ``initialize_optimizer_states``,
      ``stage3.py`` ``fp32_partitioned_groups_flat[i].grad``).
    - ``"optimizer+params"`` (ZeRO stage 3 only): also the 16-bit parameter partition.

    Not modelled here: DeepSpeed's gradient buckets and other device buffers
    (:func:`deepspeed_residuals`), the host buffers ZeRO-Offload allocates beside these
    terms (:func:`offload_host_buffers`), and under param offload the working set of
    parameters gathered to the device layer by layer.
    """
    if num_params < 0:
        raise ValueError(f"num_params={num_params} must be >= 0")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage} is not one of 0, 1, 2, 3")
    if dp < 1:
        raise ValueError(f"dp={dp} must be >= 1")
    off = _choice(offload, OffloadPlacement, "offload")
    if off == OffloadPlacement.optimizer and zero_stage == 0:
        raise ValueError(
            "offload='optimizer' needs ZeRO stage 1, 2 or 3 (DeepSpeed offloads only under ZeRO)"
        )
    if off == OffloadPlacement.optimizer_and_params and zero_stage != 3:
        raise ValueError(f"offload='optimizer+params' needs ZeRO stage 3, got zero_stage={zero_stage}")

    w, g, o = bytes_per_param(precision, optimizer)
    # ZeRO, arXiv 1910.02054, Sec. 5.1-5.3: P_os (stage >= 1), P_g (>= 2), P_p (3).
    params = _shard(num_params, w, dp) if zero_stage >= 3 else num_params * w
    grads = _shard(num_params, g, dp) if zero_stage >= 2 else num_params * g
    opt_bytes = _shard(num_params, o, dp) if zero_stage >= 1 else num_params * o
    if off == OffloadPlacement.none:
        return ModelStates(params=params, grads=grads, optimizer=opt_bytes)

    # Host side, per rank: each rank offloads its own partition (ZeRO-Offload, Sec. 4.1).
    host_grads = _shard(num_params, FP32_BYTES, dp)  # fp32 gradient partition (see docstring)
    host_params = _shard(num_params, w, dp) if off == OffloadPlacement.optimizer_and_params else 0
    return ModelStates(
        params=0 if off == OffloadPlacement.optimizer_and_params else params,
        grads=0,
        optimizer=0,
        host_params=host_params,
        host_grads=host_grads,
        host_optimizer=_shard(num_params, o, dp),
    )


def deepspeed_residuals(  # noqa: PLR0913 - public estimator API: keyword arguments named for the paper's symbols
    num_params: int,
    *,
    zero_stage: ZeroStage | int,
    dp: int,
    precision: Precision | str = Precision.bf16,
    optimizer: OptimizerName | str = OptimizerName.adamw,
    offload: OffloadPlacement | str = OffloadPlacement.none,
    reduce_bucket_size: int = 500_000_000,
    persistent_params: int = 0,
    largest_param: int = 0,
) -> dict[str, int]:
    """Named device bytes DeepSpeed 0.19 holds beyond the textbook model states, as measured.

    Each line was found by the measured ledger (runner/metrics/ledger.py: every tensor reachable
    from DeepSpeed's optimizer wrapper, counted once) and matches it within 0.1% on this
    runner's model, ZeRO 0-3, fp32 and bf16, 1 and 2 ranks:

    - ``fp32_master_copy``: fp32 training at stages 1-3 steps an fp32 partition created
      with ``.clone().float()`` (stage_1_and_2.py ``single_partition_of_fp32_groups``,
      stage3.py ``fp32_partitioned_groups_flat``): a second copy of the fp32 weights, 4P/dp.
    - ``ipg_buckets``: stage 3 allocates its gradient-reduction bucket of
      ``reduce_bucket_size`` elements in the gradient dtype up front (stage3.py), whatever
      the model's size: 2 GB in fp32 at DeepSpeed's default of 5e8 elements.
    - ``zero3_full_params (persistent or gathered)``: stage 3 keeps parameters of at most
      ``stage3_param_persistence_threshold`` elements whole on every rank beside their
      partitions (dp > 1); pass their total element count as ``persistent_params``.
    - ``temp_grad_buffer_for_gpu_offload``: ZeRO-Offload at stages 1-2 keeps a staging
      buffer of the largest parameter (``largest_param`` elements, model dtype) on the
      device (stage_1_and_2.py ``DeepSpeedZeroOptimizer.__init__``, ``torch.zeros(
      largest_param_numel, device=current_device_name())``); its host twin is in
      :func:`offload_host_buffers`.

    Stage 0 in bf16 (DeepSpeed's ``FP16_UnfusedOptimizer`` with fp32 master weights) and
    stages 1-2 in bf16 hold exactly the textbook terms.
    """
    model_states(
        num_params, zero_stage=zero_stage, dp=dp, precision=precision, optimizer=optimizer, offload=offload
    )
    prec = _choice(precision, Precision, "precision")
    off = _choice(offload, OffloadPlacement, "offload")
    grad_bytes = FP32_BYTES if prec == Precision.fp32 else 2
    residuals: dict[str, int] = {}
    if zero_stage == 3:
        # On one rank nothing is partitioned: the "partition" is the parameter itself.
        if dp > 1:
            residuals["zero3_full_params (persistent or gathered)"] = grad_bytes * persistent_params
        residuals["ipg_buckets"] = grad_bytes * reduce_bucket_size
    if prec == Precision.fp32 and zero_stage >= 1 and off == OffloadPlacement.none:
        residuals["fp32_master_copy"] = _shard(num_params, FP32_BYTES, dp)
    if zero_stage in (1, 2) and off != OffloadPlacement.none and largest_param:
        residuals["temp_grad_buffer_for_gpu_offload"] = grad_bytes * largest_param
    return residuals


def zero12_backward_buckets(
    *,
    zero_stage: ZeroStage | int,
    precision: Precision | str,
    offload: OffloadPlacement | str = OffloadPlacement.none,
    reduce_bucket_size: int,
    overlap_comm: bool = False,
    contiguous_gradients: bool = True,
) -> dict[str, int]:
    """Device bytes ZeRO 1-2 allocate during backward for the gradient bucket, named.

    DeepSpeed 0.19's stage_1_and_2.py ``setup_buckets`` allocates ``reduce_bucket_size``
    elements in the model dtype at a micro-batch's first gradient, a second one with
    ``overlap_comm`` (double buffering), and ``_release_ipg_buffers`` frees them when
    backward ends at ZeRO-2, at the step's boundary at ZeRO-1 (which reduces only there):
    they are gone at the optimizer step, where the ledger measures (so not in
    :func:`deepspeed_residuals`); runner.plan.memory counts them where they are live.
    Observed by wrapping ``torch.empty`` on a 1-rank engine: one bf16 (fp32) bucket in bf16
    (fp32), two with overlap_comm, per backward at ZeRO-2 and per step at ZeRO-1.
    Offload stages gradients through it whatever ``contiguous_gradients``
    says (``contiguous_gradients or cpu_offload``). Pass the bucket DeepSpeed is given
    (runner.engine.deepspeed_config.reduce_bucket_elements).
    """
    if zero_stage not in (1, 2):
        return {}
    if not (contiguous_gradients or _choice(offload, OffloadPlacement, "offload") != OffloadPlacement.none):
        return {}
    model_bytes = FP32_BYTES if _choice(precision, Precision, "precision") == Precision.fp32 else 2
    buffers = 2 if overlap_comm else 1
    return {"reduce_bucket (in backward)": buffers * model_bytes * reduce_bucket_size}


def offload_host_buffers(  # noqa: PLR0913 - public estimator API: keyword arguments named for the paper's symbols
    num_params: int,
    *,
    zero_stage: ZeroStage | int,
    dp: int,
    precision: Precision | str = Precision.bf16,
    optimizer: OptimizerName | str = OptimizerName.adamw,
    offload: OffloadPlacement | str = OffloadPlacement.none,
    largest_param: int = 0,
    held_params: int | None = None,
    accum_steps: int | None = None,
) -> dict[str, int]:
    """Named host bytes per rank ZeRO-Offload (DeepSpeed 0.19.8, ``device: cpu``) holds beyond the host terms.

    :func:`model_states` puts the offloaded terms on the host: the optimizer states (with
    the fp32 master weights in 16-bit training) and the fp32 gradient partition the CPU
    optimizer steps on (stage_1_and_2.py ``initialize_optimizer_states``:
    ``single_partition_of_fp32_groups[i].grad``; stage3.py ``initialize_optimizer_states``:
    ``fp32_partitioned_groups_flat[i].grad``). DeepSpeed allocates these besides, with P =
    `num_params` (this rank's, before ZeRO), N_d = `dp`, p = 2 (bf16/fp16) or 4 (fp32) bytes
    of the model dtype, all on the offload device (``self.device = 'cpu'``):

    Stages 1-2 (stage_1_and_2.py, ``DeepSpeedZeroOptimizer``):

    - ``fp32_master_copy`` (fp32 training only; in 16-bit it is the master weight the
      optimizer term counts): ``__init__``'s ``weights_partition = ...detach().clone()``,
      the fp32 partition the CPU optimizer steps, 4 ceil(P / N_d).
    - ``param_buffer_of_bit16_for_cpu_offload_groups``: ``__init__``'s ``temp_buffer_bit16``,
      a model-dtype copy of the partition that ``step`` writes the updated weights through
      to the device, p ceil(P / N_d).
    - ``temp_grad_buffer_for_cpu_offload``: ``__init__``, ``torch.zeros(largest_param_numel,
      device=self.device)``, p x `largest_param` (the largest parameter tensor of the model,
      whatever N_d).
    - ``accumulated_grads_in_cpu`` (stage 2 with gradient accumulation, ``accum_steps`` > 1):
      ``copy_grads_in_partition`` -> ``async_accumulate_grad_in_cpu_via_gpu`` keeps one
      ``torch.zeros(param.numel())`` per parameter of this rank's partition, whole even
      where it straddles the partition boundary: p x `held_params` (default: P when
      N_d = 1, else the bound min(P, ceil(P / N_d) + s x `largest_param`), s = 1 at N_d = 2
      and 2 beyond, where a middle rank has a boundary on each side;
      ``zero12_held_elements`` counts it exactly from the tensor sizes).
      ``accum_steps=None`` (not known) counts it. Stage 1 reduces only at the boundary
      (engine.py ``allreduce_gradients``), so it never accumulates there (measured: absent).

    Stage 3 (stage3.py, ``DeepSpeedZeroOptimizer_Stage3``):

    - ``fp32_master_copy`` (fp32 training only): ``_create_fp32_partitions``'s
      ``converted.clone().detach()``, 4 ceil(P / N_d).
    - ``grad_partitions_flat_buffer``: ``_setup_for_real_optimizer``, the gradient
      partitions in ``gradient_accumulation_dtype`` (the model dtype unless
      ``data_types.grad_accum_dtype`` says otherwise) on ``self.device``, which offload
      makes the host: p ceil(P / N_d). Without offload it is the device's ``grads`` term.

    Bucket sizes do not enter: with ``device: cpu`` every one of these is sized by the
    parameters (``reduce_bucket_size`` sizes device buffers: :func:`deepspeed_residuals`).
    ``pin_memory`` changes where they live (page-locked), not their size; NVMe offload's
    swap buffers (``buffer_count`` x ``buffer_size``) are not modelled. Scalars (per-tensor
    gradient norms, 8 bytes each) are left out.
    """
    model_states(
        num_params, zero_stage=zero_stage, dp=dp, precision=precision, optimizer=optimizer, offload=offload
    )
    if _choice(offload, OffloadPlacement, "offload") == OffloadPlacement.none:
        return {}
    if largest_param < 0 or (accum_steps is not None and accum_steps < 1):
        raise ValueError(f"largest_param={largest_param} must be >= 0 and accum_steps={accum_steps} >= 1")
    p = FP32_BYTES if _choice(precision, Precision, "precision") == Precision.fp32 else HALF_BYTES
    partition = _shard(num_params, 1, dp)  # elements
    buffers: dict[str, int] = {}
    if p == FP32_BYTES:
        buffers["fp32_master_copy"] = FP32_BYTES * partition
    if zero_stage == 3:
        buffers["grad_partitions_flat_buffer"] = p * partition
        return buffers
    buffers["param_buffer_of_bit16_for_cpu_offload_groups"] = p * partition
    buffers["temp_grad_buffer_for_cpu_offload"] = p * largest_param
    if zero_stage == 2 and (accum_steps is None or accum_steps > 1):
        if held_params is None:
            straddlers = 1 if dp == 2 else 2
            held_params = num_params if dp == 1 else min(num_params, partition + straddlers * largest_param)
        buffers["accumulated_grads_in_cpu"] = p * held_params
    return buffers


def zero12_held_elements(numels: list[int], dp: int) -> int:
    """Gradient elements the fullest rank holds at ZeRO 1-2: each tensor its partition touches, whole.

    DeepSpeed's stage_1_and_2.py flattens the parameters in module order (``numels``), cuts
    the flat buffer into dp equal partitions (the last padded), and a rank keeps the
    gradient of every parameter that intersects its partition in full. A tensor straddling
    a boundary is held whole by both neighbours, so a rank holds up to two tensors beyond
    P/dp, and the ranks differ (measured on the tiny model, 2 ranks: rank 0 1,647,616
    elements, rank 1 1,758,464, 6.7% more; P/dp is 1,614,976).
    """
    if dp < 1:
        raise ValueError(f"dp={dp} must be at least 1")
    if not numels:
        return 0
    partition = -(-sum(numels) // dp)
    ends = list(itertools.accumulate(numels))  # tensor k spans [ends[k] - numels[k], ends[k])
    starts = [end - numel for end, numel in zip(ends, numels, strict=True)]
    fullest = 0
    for rank in range(dp):  # the tensors that end after the partition starts and start before it ends
        first = bisect.bisect_right(ends, rank * partition)
        after = bisect.bisect_left(starts, (rank + 1) * partition)
        if after > first:
            fullest = max(fullest, ends[after - 1] - starts[first])
    return fullest


# --------------------------------------------------------------------------------------
# Activations: Korthikanti et al. 2022, as published
# --------------------------------------------------------------------------------------


def _check_recompute(recompute: Any) -> Recompute:
    return _choice(recompute, Recompute, "recompute")


def korthikanti_activation_items(
    *,
    seq_len: int,
    micro_size: int,
    d_model: int,
    n_heads: int,
    tp: int = 1,
    recompute: Recompute | str = Recompute.none,
    flash: bool = False,
) -> dict[str, float]:
    """The paper's per-layer activation bytes of a GPT block, tensor by tensor (16-bit, with dropout).

    Korthikanti et al. 2022 (arXiv 2205.05198), Sec. 4.1, s = seq_len, b = micro_size,
    h = d_model, a = n_heads, t = tp (activations 2 bytes, dropout masks 1 byte):

    - attention: QKV input 2sbh; Q, K for QK^T 4sbh; softmax output 2as^2b; its dropout
      mask as^2b; dropout output (attention-over-values input) 2as^2b; V 2sbh; projection
      input 2sbh; residual dropout mask sbh: total 11sbh + 5as^2b.
    - MLP (4h wide, GeLU): input 2sbh; GeLU input 8sbh; second linear input 8sbh; dropout
      mask sbh: total 19sbh.
    - two LayerNorms' inputs: 4sbh.

    Sum (eq. 1): sbh(34 + 5as/h). With tensor parallel t (eq. 2) the LayerNorm inputs, the
    QKV and MLP inputs and the two residual dropout masks (10sbh) are replicated, the rest is
    split: sbh(10 + 24/t + 5as/(ht)). Selective recompute drops the 5as^2b/t score terms;
    full recompute keeps only the block input, 2sbh (Sec. 5). ``flash=True`` (memory-efficient
    attention) also drops the score terms but keeps a logsumexp of a*s*b/t fp32 values.
    """
    mode = _check_recompute(recompute)
    s, b, h, a, t = seq_len, micro_size, d_model, n_heads, tp
    sbh = s * b * h
    if mode == Recompute.full:
        return {"block.input": 2 * sbh}
    items: dict[str, float] = {
        "layernorm1.input": 2 * sbh,
        "qkv.input": 2 * sbh,
        "attention.qk": 4 * sbh / t,
        "attention.v": 2 * sbh / t,
        "attention.proj_input": 2 * sbh / t,
        "attention.dropout_mask": 1 * sbh,
        "layernorm2.input": 2 * sbh,
        "mlp.input": 2 * sbh,
        "mlp.gelu_input": 8 * sbh / t,
        "mlp.fc2_input": 8 * sbh / t,
        "mlp.dropout_mask": 1 * sbh,
    }
    if mode == Recompute.none and not flash:
        scores = a * s * s * b / t
        items["attention.softmax_output"] = 2 * scores
        items["attention.softmax_dropout_mask"] = 1 * scores
        items["attention.softmax_dropout_output"] = 2 * scores
    elif mode == Recompute.none:
        items["attention.logsumexp_fp32"] = FP32_BYTES * a * s * b / t
    return items


def korthikanti_activations_per_layer(
    *,
    seq_len: int,
    micro_size: int,
    d_model: int,
    n_heads: int,
    tp: int = 1,
    recompute: Recompute | str = Recompute.none,
    flash: bool = False,
) -> float:
    """Korthikanti et al. 2022 eq. 1-2 per-layer activation bytes (16-bit GPT block); see the items."""
    return sum(
        korthikanti_activation_items(
            seq_len=seq_len,
            micro_size=micro_size,
            d_model=d_model,
            n_heads=n_heads,
            tp=tp,
            recompute=recompute,
            flash=flash,
        ).values()
    )


# --------------------------------------------------------------------------------------
# Activations: this project's block (runner/model/transformer.py), tensor by tensor
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockShape:
    """What the activations of one block of runner/model/transformer.py depend on, for one micro-batch.

    s = ``seq_len``, b = ``micro_size``, h = ``d_model``, a = ``n_heads``, kv = ``n_kv_heads``
    (default a), f = ``ffn_hidden`` (default 4h), t = ``tp``, p = ``bytes_per_elem`` (the
    compute dtype: 2 for bf16/fp16, 4 for fp32). ``flash``: SDPA takes a fused kernel.
    ``attn_out_aliased`` and ``graph`` (eager, one compiled graph, or compiled graphs split
    at collectives): see :func:`activation_items_per_layer`.
    """

    seq_len: int
    micro_size: int
    d_model: int
    n_heads: int
    n_kv_heads: int | None = None
    ffn_hidden: int | None = None
    tp: int = 1
    flash: bool = False
    bytes_per_elem: int = 2
    attn_out_aliased: bool = False
    graph: BlockGraph = "eager"

    def __post_init__(self) -> None:
        n_kv, ffn = self.kv_heads, self.ffn
        if min(self.seq_len, self.micro_size, self.d_model, self.n_heads, n_kv, ffn, self.tp) < 1:
            raise ValueError(
                "seq_len, micro_size, d_model, n_heads, n_kv_heads, ffn_hidden and tp must be >= 1"
            )
        if self.graph not in _GRAPHS:
            raise ValueError(f"graph={self.graph!r} is not one of {', '.join(_GRAPHS)}")
        if self.bytes_per_elem not in (HALF_BYTES, FP32_BYTES):
            raise ValueError(f"bytes_per_elem={self.bytes_per_elem} must be 2 (bf16/fp16) or 4 (fp32)")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % n_kv:
            raise ValueError(f"n_kv_heads={n_kv} must divide n_heads={self.n_heads}")
        # Megatron-style tensor parallelism splits heads and the MLP's hidden width.
        for name, value in (("n_heads", self.n_heads), ("n_kv_heads", n_kv), ("ffn_hidden", ffn)):
            if value % self.tp:
                raise ValueError(f"tp={self.tp} must divide {name}={value}")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn(self) -> int:
        return 4 * self.d_model if self.ffn_hidden is None else self.ffn_hidden

    @property
    def sb(self) -> int:
        """Tokens per micro-batch: s * b."""
        return self.seq_len * self.micro_size

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def local_heads(self) -> int:
        """Query heads on one tensor-parallel rank: a' = a/t."""
        return self.n_heads // self.tp

    @property
    def q_width(self) -> int:
        """Query width on one rank: h' = a' * hs."""
        return self.local_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Key (or value) width on one rank: kv' = kv/t * hs."""
        return self.kv_heads // self.tp * self.head_dim

    @property
    def local_ffn(self) -> int:
        """MLP hidden width on one rank: f' = f/t."""
        return self.ffn // self.tp


def model_block_shape(
    model: ModelConfig,
    *,
    seq_len: int,
    micro_size: int,
    tp: int,
    bytes_per_elem: int,
    graph: BlockGraph = "eager",
) -> BlockShape:
    """The BlockShape of a ``ModelConfig`` (runner/config.py) at this micro-batch and tp.

    flash=True: runner/model/transformer.py calls scaled_dot_product_attention(is_causal=True), which
    takes a fused kernel on CUDA and on CPU (tests/unit/test_memory.py checks the CPU one).
    """
    return BlockShape(
        seq_len=seq_len,
        micro_size=micro_size,
        d_model=model.d_model,
        n_heads=model.n_head,
        n_kv_heads=model.n_kv_head,
        ffn_hidden=model.ffn_hidden,
        tp=tp,
        flash=True,
        bytes_per_elem=bytes_per_elem,
        graph=graph,
    )


def block_graph(compile_blocks: bool, *, tp: int, zero_stage: ZeroStage | int) -> BlockGraph:
    """How a block runs for BlockShape.graph: eager, or with ``train.compile=true`` one graph or several.

    Measured (runner/engine/compile_blocks.py's summary, tiny model, torch 2.13): ddp, ZeRO 1-2 and
    the pipeline compile each block without a graph break ("whole"). Tensor parallel breaks
    it at its all-reduces and ZeRO-3 at every parameter gather ("split").
    """
    if not compile_blocks:
        return "eager"
    return "whole" if tp == 1 and zero_stage < 3 else "split"


def _rmsnorm_items(prefix: str, x: BlockShape) -> dict[str, int]:
    """What runner/model/transformer.py's RMSNorm saves: x.float(), rsqrt, and the normed value before the
    gain.

    ``x32 = x.float(); normed = x32 * rsqrt(mean(x32^2) + eps); normed.type_as(x) * weight``:
    the product x32 * rstd saves both factors (the fp32 input, 4 B/elem: a copy for 16-bit
    x, x itself in fp32; and rstd, 4 B per token); the gain multiply saves the normed value
    in the compute dtype. The output is counted as the next linear's input.

    Compiled (x.graph "whole" or "split"): the graph saves the input in its own dtype and
    rstd, and recomputes the upcast and the normed value in backward.
    """
    if x.graph != "eager":
        return {
            f"{prefix}.input": x.bytes_per_elem * x.sb * x.d_model,
            f"{prefix}.rstd_fp32": FP32_BYTES * x.sb,
        }
    return {
        f"{prefix}.input_fp32": FP32_BYTES * x.sb * x.d_model,
        f"{prefix}.rstd_fp32": FP32_BYTES * x.sb,
        f"{prefix}.normed": x.bytes_per_elem * x.sb * x.d_model,
    }


def _attention_core_items(x: BlockShape) -> dict[str, int]:
    """What RoPE + SDPA (``Attention._core``) save; the part that selective recompute redoes."""
    p = x.bytes_per_elem
    items: dict[str, int] = {}
    # RoPE's multiplies save only cos/sin (x * cos needs cos, not x): views of the fp32
    # buffers, which DeepSpeed 0.19.8 keeps in fp32 under bf16/fp16 (engine.py
    # _configure_distributed_model: "Cast params only; preserve fp32 buffers"). A model cast
    # wholesale (module.to(torch.bfloat16)) would make apply_rope's cos.float()/sin.float()
    # save 4 fp32 copies of (s, hs/2) per layer, 8*s*hs bytes, not counted here.
    # So the rotated q, k are saved once, by SDPA. runner/model/transformer.py repeats k, v to n_head
    # with repeat_interleave before SDPA, so SDPA saves them at full width even with GQA.
    if x.flash:
        # Flash / memory-efficient kernels (CPU: _scaled_dot_product_flash_attention_for_cpu,
        # measured for fp32 and bf16): save q, k, v, out and an fp32 logsumexp (b, a, s).
        items["sdpa.q"] = p * x.sb * x.q_width
        items["sdpa.k"] = p * x.sb * x.q_width
        items["sdpa.v"] = p * x.sb * x.q_width
        items["sdpa.out"] = p * x.sb * x.q_width
        items["sdpa.logsumexp_fp32"] = FP32_BYTES * x.local_heads * x.sb
    else:
        # torch's math path (measured on CPU, torch 2.13): saves scaled copies of q and k, v,
        # and the softmax probabilities (b, a, s, s): all in fp32, as it upcasts 16-bit
        # inputs. Its output is not saved. Korthikanti's 5as/h term is the 16-bit version of
        # the probabilities plus dropout (absent here).
        items["sdpa_math.q_scaled_fp32"] = FP32_BYTES * x.sb * x.q_width
        items["sdpa_math.k_scaled_fp32"] = FP32_BYTES * x.sb * x.q_width
        items["sdpa_math.v_fp32"] = FP32_BYTES * x.sb * x.q_width
        items["sdpa_math.probs_fp32"] = FP32_BYTES * x.local_heads * x.seq_len**2 * x.micro_size
    return items


def activation_items_per_layer(
    block: BlockShape, recompute: Recompute | str = Recompute.none
) -> dict[str, int]:
    """Bytes autograd keeps per block of runner/model/transformer.py for backward, tensor by tensor.

    Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4.1) adapted to this block: no dropout
    (its masks, as^2b + 2sbh, are gone), RMSNorm computed in fp32, RoPE, SwiGLU of width
    f, GQA with k, v repeated to n_head. Sizes as in :class:`BlockShape`; a' = a/t,
    h' = h/t, f' = f/t.

    recompute="none" (every tensor saved by each op, in forward order):

    ==========================  ==================  ======================================
    attention_norm.input_fp32   4 sbh               x.float() (x itself in fp32)
    attention_norm.rstd_fp32    4 sb                rsqrt(mean(x^2) + eps)
    attention_norm.normed       p sbh               normed.type_as(x), saved by `* weight`
    attention.input             p sbh               input of wq, wk, wv (norm output)
    sdpa.q / .k / .v            3 p sbh'            rotated q, k; v; k, v repeated to a'
    sdpa.out                    p sbh'              SDPA output
    sdpa.logsumexp_fp32         4 a'sb              flash kernels only
    wo.input                    p sbh'              y.transpose(1, 2).reshape copy of out
    ffn_norm.*                  4sbh + 4sb + p sbh  as attention_norm
    feed_forward.input          p sbh               input of w1, w3
    w1.output                   p sbf'              silu's input
    silu.output                 p sbf'              saved by the product (w3 x needs grad)
    w3.output                   p sbf'              the product's other factor
    w2.input                    p sbf'              silu(w1 x) * w3 x
    ==========================  ==================  ======================================

    RoPE itself keeps nothing new (its tables are fp32 buffers, kept fp32 by DeepSpeed).

    In bf16 with flash: sbh(26 + 8f/h) + sb(8 + 4a), vs the paper's sbh * 34 (its
    LayerNorm keeps 2 B/elem where this RMSNorm keeps 4 + 2, and SwiGLU keeps four f-wide
    tensors where GeLU keeps two 4h-wide ones). ``flash=False`` replaces the sdpa.* items by
    torch's math path (q, k scaled, v, probabilities: 4(3 sbh' + a's^2b)).

    recompute="selective" (``Attention._core`` = RoPE + SDPA under torch.utils.checkpoint):
    the core's items go; its inputs are kept instead: q (p sbh'), k and v before the GQA
    repeat (2 p sb kv', kv' = n_kv_heads*hs/t). recompute="full" (each block under
    torch.utils.checkpoint): only the block input, p sbh (Korthikanti Sec. 5's 2sbh in 16-bit).

    Tensor parallel: as Korthikanti eq. 2, norm inputs/outputs and the inputs of the
    column-parallel linears stay replicated; the per-head and f-wide tensors split by t.

    ``attn_out_aliased``: on CPU the SDPA output is laid out (B, nh, T, hs), so the reshape
    feeding wo copies it (measured: two tensors). Kernels that return a (B, T, nh, hs)
    layout, as CUDA flash attention is understood to, make that reshape a view: set True to
    count sdpa.out and wo.input once (not verified on a GPU here).

    ``graph`` (:func:`block_graph`): a compiled block's saved tensors are chosen by
    AOTAutograd's min-cut partitioner, which recomputes cheap pointwise ops in backward
    (torch/_functorch/partitioners.py, ``min_cut_rematerialization_partition``). Measured
    on CPU, torch 2.13, fp32 and bf16, with and without selective recompute: each norm
    keeps its input in the compute dtype and rstd (p sbh + 4 sb in place of 4 sbh + 4 sb +
    p sbh), and, in one graph ("whole"), ``silu.output`` is recomputed (p sbf' less). In
    bf16 that is 8 sbh + 2 sbf less per layer: 28% of the tiny model's block. Split at
    collectives ("split": ZeRO-3's gathers, tensor parallel's all-reduces), silu and the
    product land in different graphs, so silu's output is kept; the norms still save less.
    Measured on 2 ranks, fp32, to the byte: ZeRO-3 and tp 2.

    Not counted: parameters and buffers (model states) and tensors freed inside forward.
    """
    mode = _check_recompute(recompute)
    x, p = block, block.bytes_per_elem
    if mode == Recompute.full:
        # torch.utils.checkpoint keeps the block's input (and the cos/sin buffer views).
        return {"block.input": p * x.sb * x.d_model}

    items = _rmsnorm_items("attention_norm", x)
    items["attention.input"] = p * x.sb * x.d_model
    if mode == Recompute.none:
        items.update(_attention_core_items(x))
    else:  # selective: checkpoint(self._core, q, k, v, cos, sin) keeps the core's inputs
        items["attention_core.q"] = p * x.sb * x.q_width
        items["attention_core.k"] = p * x.sb * x.kv_width
        items["attention_core.v"] = p * x.sb * x.kv_width
    if not (mode == Recompute.none and x.flash and x.attn_out_aliased):
        items["wo.input"] = p * x.sb * x.q_width
    items.update(_rmsnorm_items("ffn_norm", x))
    items["feed_forward.input"] = p * x.sb * x.d_model
    swiglu = ("w1.output", "silu.output", "w3.output", "w2.input")
    for name in swiglu:
        if name == "silu.output" and x.graph == "whole":
            continue  # recomputed from w1.output in backward
        items[name] = p * x.sb * x.local_ffn
    return items


def activations_per_layer(block: BlockShape, recompute: Recompute | str = Recompute.none) -> int:
    """Activation bytes one block of runner/model/transformer.py keeps for backward (see
    activation_items_per_layer)."""
    return sum(activation_items_per_layer(block, recompute).values())


# Items of activation_items_total that are not kept for backward but are live at a peak.
TRANSIENT_ITEMS = frozenset(
    {
        "transient.logits",
        "transient.logits_fp32",
        "transient.loss_grads_fp32",
        "transient.final_norm_backward",
        "transient.recompute_layer",
    }
)


def at_the_loss(items: dict[str, int]) -> int:
    """The larger of the loss's transients: the logits as forward ends, its gradients as backward starts."""
    return max(items["transient.logits"] + items["transient.logits_fp32"], items["transient.loss_grads_fp32"])


def after_the_head(items: dict[str, int]) -> int:
    """What the final norm's backward holds beyond the kept items, less what is freed by then.

    By then the loss's saved tensors, the head's input and the norm's output are freed;
    the norm's fp32 working set is live (``transient.final_norm_backward``). Negative when
    the freed outweigh it, as with any vocabulary over a few times h; the tiny model's
    256 entries make it the activation peak.
    """
    freed = sum(v for k, v in items.items() if k.startswith("loss."))
    freed += items["output.input"] + items["final_norm.normed"]
    return items["transient.final_norm_backward"] - freed


def transient_peak(items: dict[str, int]) -> int:
    """The most the transients add to the kept items at once: the loss's, the final norm's
    backward or a recomputed block's (their moments do not coincide)."""
    return max(at_the_loss(items), after_the_head(items), items["transient.recompute_layer"])


def activation_items_outside_blocks(block: BlockShape, *, vocab_size: int) -> dict[str, int]:
    """Bytes outside the blocks: embedding, final norm, output head and the fp32 loss
    (runner/model/transformer.py).

    Kept for backward (b = micro_size, s = seq_len, h = d_model, V = vocab_size, p as above):

    - ``embedding.token_ids``: the lookup saves its int64 indices (8 sb). Its output is
      block 0's input, already counted by that block (its norm input, or the checkpoint).
    - ``final_norm.*``: RMSNorm as in the blocks (4 sbh + 4 sb + p sbh).
    - ``output.input``: the final norm's output, saved by the output linear (p sbh).
    - ``loss.log_probs_fp32``: lm_loss computes cross_entropy on ``logits.float()``;
      log_softmax saves its fp32 output (4 sbV). ``loss.targets``: int64 (8 sb).

    Live while the loss is formed, then freed (``transient.*``, not saved): the logits in the
    compute dtype (p sbV; nothing saves them) and, in 16-bit, their fp32 copy (4 sbV). Live
    when backward starts, beside the saved log-probabilities: ``nll_loss``'s gradient (a
    dense fp32 (sb, V) tensor) and ``log_softmax``'s, made from it (4 sbV each:
    ``transient.loss_grads_fp32``); the forward's and the backward's transients do not
    coincide, and the backward's are the larger (8 sbV against at most 6). The V-wide terms
    dominate for large vocabularies: Llama-3's V = 128256 at h = 2048 makes 4 sbV alone
    250 sbh.

    Live in the final norm's backward, after the output head's (``transient.final_norm_backward``,
    20 sbh in any dtype: its statistics are fp32): at the square's backward (PowBackward0:
    ``grad * 2 * x``, three fp32 sbh tensors at once) the gradient through the rsqrt's
    product and the mean's expanded gradient are live too. Seen in the allocator's events
    of a bf16 step (tiny, micro 8, seq 128): five 1.05 MB tensors above what the loss and
    the head's input had freed. It outgrows the loss's moment only for small vocabularies
    (:func:`after_the_head`); runner.plan.memory adds it to what ZeRO 1-2's bucket and a tied
    head's gradient allocate once the head's backward is done.

    These stay eager under ``train.compile`` (only the blocks are compiled).

    Under tensor parallelism (``block.tp`` = t > 1) the output head is split by vocabulary
    (runner/parallel/tensor.py): the fullest rank holds v = ceil(V / t) columns of the
    logits, and DeepSpeed's vocabulary-parallel cross-entropy (deepspeed/sequence/
    cross_entropy.py ``_VocabParallelCrossEntropy``) saves its fp32 exponentials (4 sbv),
    each token's sum of them (4 sb), the local targets (8 sb) and two boolean masks (2 sb).
    While it forms them the logits (p sbv), their fp32 copy in 16-bit (4 sbv) and the
    max-shifted logits (4 sbv) are live. Its backward makes the gradient from the saved
    exponentials (4 sbv) and, in 16-bit, casts it to the logits' dtype (p sbv). The
    embedding, split by vocabulary too, saves the mask of the tokens outside its slice
    (1 sb) beside their indices.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be >= 1")
    p, sb, h = block.bytes_per_elem, block.sb, block.d_model
    items = {
        "embedding.token_ids": INT64_BYTES * sb,
        "final_norm.input_fp32": FP32_BYTES * sb * h,
        "final_norm.rstd_fp32": FP32_BYTES * sb,
        "final_norm.normed": p * sb * h,
        "output.input": p * sb * h,
        "transient.final_norm_backward": 5 * FP32_BYTES * sb * h,
    }
    if block.tp == 1:
        return {
            **items,
            "loss.log_probs_fp32": FP32_BYTES * sb * vocab_size,
            "loss.targets": INT64_BYTES * sb,
            "transient.logits": p * sb * vocab_size,
            # .float() of fp32 logits returns the same tensor: no copy.
            "transient.logits_fp32": FP32_BYTES * sb * vocab_size if p < FP32_BYTES else 0,
            "transient.loss_grads_fp32": 2 * FP32_BYTES * sb * vocab_size,
        }
    local = -(-vocab_size // block.tp)  # runner.model.shape.vocab_rows
    copies = 2 if p < FP32_BYTES else 1  # the fp32 copy (16-bit only) and the shifted logits
    return {
        **items,
        "embedding.vocab_mask": BOOL_BYTES * sb,
        "loss.exp_logits_fp32": FP32_BYTES * sb * local,
        "loss.sum_exp_fp32": FP32_BYTES * sb,
        "loss.targets": INT64_BYTES * sb,
        "loss.target_masks": 2 * BOOL_BYTES * sb,
        "transient.logits": p * sb * local,
        "transient.logits_fp32": copies * FP32_BYTES * sb * local,
        "transient.loss_grads_fp32": FP32_BYTES * sb * local + (p * sb * local if p < FP32_BYTES else 0),
    }


def activation_items_total(
    block: BlockShape,
    *,
    n_layers: int,
    vocab_size: int,
    recompute: Recompute | str = Recompute.none,
) -> dict[str, int]:
    """Activation bytes of the whole model per device, itemised: blocks, outside items, transients.

    ``blocks`` is n_layers x :func:`activations_per_layer`. Outside items as in
    :func:`activation_items_outside_blocks`. ``transient.recompute_layer``: with recompute,
    backward rebuilds one block's (or one attention core's) saved tensors at a time, live
    next to everything still kept.
    """
    mode = _check_recompute(recompute)
    if n_layers < 1:
        raise ValueError(f"n_layers={n_layers} must be >= 1")
    items = {"blocks": n_layers * activations_per_layer(block, mode)}
    items.update(activation_items_outside_blocks(block, vocab_size=vocab_size))
    if mode == Recompute.none:
        items["transient.recompute_layer"] = 0
    else:
        # Full: one block is re-run whole; selective: one attention core (none minus selective).
        rebuilt = activations_per_layer(block, Recompute.none)
        if mode == Recompute.selective:
            rebuilt = max(rebuilt - activations_per_layer(block, Recompute.selective), 0)
        items["transient.recompute_layer"] = rebuilt
    return items


def activations_total(
    block: BlockShape,
    *,
    n_layers: int,
    vocab_size: int,
    recompute: Recompute | str = Recompute.none,
) -> int:
    """Peak activation bytes per device: everything kept for backward plus the larger transient.

    = sum of the kept items of :func:`activation_items_total` + :func:`transient_peak`.
    """
    items = activation_items_total(block, n_layers=n_layers, vocab_size=vocab_size, recompute=recompute)
    kept = sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)
    return kept + transient_peak(items)


def to_gb(num_bytes: float) -> float:
    """Bytes to decimal GB (1e9 bytes), the unit of the memory/*_gb metrics."""
    return num_bytes / GB


def to_gib(num_bytes: float) -> float:
    """Bytes to GiB (2**30 bytes)."""
    return num_bytes / GiB


__all__ = [
    "GB",
    "TRANSIENT_ITEMS",
    "BlockGraph",
    "BlockShape",
    "GiB",
    "ModelStates",
    "activation_items_outside_blocks",
    "activation_items_per_layer",
    "activation_items_total",
    "activations_per_layer",
    "activations_total",
    "after_the_head",
    "block_graph",
    "bytes_per_param",
    "deepspeed_residuals",
    "korthikanti_activation_items",
    "korthikanti_activations_per_layer",
    "model_block_shape",
    "model_states",
    "offload_host_buffers",
    "to_gb",
    "to_gib",
    "transient_peak",
]
