"""Model states after ZeRO: parameters, gradients and optimizer states per device, and the buffers
DeepSpeed 0.19 holds beside them (device and host), in bytes.

Pure arithmetic, bytes in and bytes out: ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054,
Fig. 1 and Sec. 5), derived from the tensors each precision/optimizer really keeps.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from runner.config import OffloadPlacement, OptimizerName, Precision, ZeroStage
from runner.memory_model.units import FP32_BYTES, _choice, _shard
from runner.rules import offload_problems, offload_switches


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
    master = 0 if prec is Precision.fp32 else FP32_BYTES  # 16-bit training's fp32 master weights
    return prec.bytes, prec.bytes, master + state


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
    if zero_stage not in tuple(ZeroStage):
        raise ValueError(f"zero_stage={zero_stage} is not one of 0, 1, 2, 3")
    if dp < 1:
        raise ValueError(f"dp={dp} must be >= 1")
    stage = ZeroStage(zero_stage)
    off = _choice(offload, OffloadPlacement, "offload")
    problems = offload_problems(zero_stage, *offload_switches(off))  # runner.rules.offload_stages
    if problems:
        raise ValueError("; ".join(problems))

    w, g, o = bytes_per_param(precision, optimizer)
    # ZeRO, arXiv 1910.02054, Sec. 5.1-5.3: P_os (stage >= 1), P_g (>= 2), P_p (3).
    params = _shard(num_params, w, dp) if stage.shards_parameters else num_params * w
    grads = _shard(num_params, g, dp) if stage.shards_gradients else num_params * g
    opt_bytes = _shard(num_params, o, dp) if stage.shards_optimizer_states else num_params * o
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
    stage = ZeroStage(zero_stage)  # model_states checked it
    prec = _choice(precision, Precision, "precision")
    off = _choice(offload, OffloadPlacement, "offload")
    grad_bytes = prec.bytes
    residuals: dict[str, int] = {}
    if stage is ZeroStage.zero3:
        # On one rank nothing is partitioned: the "partition" is the parameter itself.
        if dp > 1:
            residuals["zero3_full_params (persistent or gathered)"] = grad_bytes * persistent_params
        residuals["ipg_buckets"] = grad_bytes * reduce_bucket_size
    if prec == Precision.fp32 and stage.shards_optimizer_states and off == OffloadPlacement.none:
        residuals["fp32_master_copy"] = _shard(num_params, FP32_BYTES, dp)
    if stage in (ZeroStage.zero1, ZeroStage.zero2) and off != OffloadPlacement.none and largest_param:
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
    :func:`deepspeed_residuals`); runner.memory_model.peak counts them where they are live.
    Observed by wrapping ``torch.empty`` on a 1-rank engine: one bf16 (fp32) bucket in bf16
    (fp32), two with overlap_comm, per backward at ZeRO-2 and per step at ZeRO-1.
    Offload stages gradients through it whatever ``contiguous_gradients``
    says (``contiguous_gradients or cpu_offload``). Pass the bucket DeepSpeed is given
    (runner.engine.deepspeed_config.reduce_bucket_elements).
    """
    if zero_stage not in (ZeroStage.zero1, ZeroStage.zero2):
        return {}
    if not (contiguous_gradients or _choice(offload, OffloadPlacement, "offload") != OffloadPlacement.none):
        return {}
    model_bytes = _choice(precision, Precision, "precision").bytes
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
    of the model dtype, all on the offload device (``self.device = 'cpu'``): stages 1-2 in
    :func:`_zero12_offload_buffers`, stage 3 in :func:`_zero3_offload_buffers`.

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
    zero_stage = ZeroStage(zero_stage)  # model_states checked it
    prec = _choice(precision, Precision, "precision")
    partition = _shard(num_params, 1, dp)  # elements
    if zero_stage is ZeroStage.zero3:
        return _zero3_offload_buffers(prec, partition)
    return _zero12_offload_buffers(
        prec,
        partition,
        zero_stage=zero_stage,
        num_params=num_params,
        dp=dp,
        largest_param=largest_param,
        held_params=held_params,
        accum_steps=accum_steps,
    )


def _zero12_offload_buffers(  # noqa: PLR0913 - offload_host_buffers' own arguments, handed on
    prec: Precision,
    partition: int,
    *,
    zero_stage: ZeroStage,
    num_params: int,
    dp: int,
    largest_param: int,
    held_params: int | None,
    accum_steps: int | None,
) -> dict[str, int]:
    """The host buffers ZeRO-Offload adds at stages 1-2 (stage_1_and_2.py,
    ``DeepSpeedZeroOptimizer``), `partition` = ceil(P / N_d) elements:

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
    """
    p = prec.bytes
    buffers: dict[str, int] = {}
    if prec is Precision.fp32:
        buffers["fp32_master_copy"] = FP32_BYTES * partition
    buffers["param_buffer_of_bit16_for_cpu_offload_groups"] = p * partition
    buffers["temp_grad_buffer_for_cpu_offload"] = p * largest_param
    if zero_stage is ZeroStage.zero2 and (accum_steps is None or accum_steps > 1):
        if held_params is None:
            straddlers = 1 if dp == 2 else 2
            held_params = num_params if dp == 1 else min(num_params, partition + straddlers * largest_param)
        buffers["accumulated_grads_in_cpu"] = p * held_params
    return buffers


def _zero3_offload_buffers(prec: Precision, partition: int) -> dict[str, int]:
    """The host buffers ZeRO-Offload adds at stage 3 (stage3.py,
    ``DeepSpeedZeroOptimizer_Stage3``), `partition` = ceil(P / N_d) elements:

    - ``fp32_master_copy`` (fp32 training only): ``_create_fp32_partitions``'s
      ``converted.clone().detach()``, 4 ceil(P / N_d).
    - ``grad_partitions_flat_buffer``: ``_setup_for_real_optimizer``, the gradient
      partitions in ``gradient_accumulation_dtype`` (the model dtype unless
      ``data_types.grad_accum_dtype`` says otherwise) on ``self.device``, which offload
      makes the host: p ceil(P / N_d). Without offload it is the device's ``grads`` term.
    """
    buffers: dict[str, int] = {}
    if prec is Precision.fp32:
        buffers["fp32_master_copy"] = FP32_BYTES * partition
    buffers["grad_partitions_flat_buffer"] = prec.bytes * partition
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


__all__ = [
    "ModelStates",
    "bytes_per_param",
    "deepspeed_residuals",
    "model_states",
    "offload_host_buffers",
    "zero12_backward_buckets",
    "zero12_held_elements",
]
