"""What one device's memory depends on (MemoryCase) and what its fullest rank holds through a step
(HeldStates): the one source the plan's peak (runner.memory_model.peak) and the ledger's boundary
estimate (runner.memory_model.boundary) both build on.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import (
    ModelConfig,
    Offload,
    OffloadPlacement,
    OptimizerName,
    ParallelConfig,
    ParallelSpec,
    Precision,
    Recompute,
    ZeroStage,
)
from runner.engine.deepspeed_config import persistence_threshold_elements, reduce_bucket_elements
from runner.memory_model.activations import BlockShape, block_graph, model_block_shape
from runner.memory_model.states import (
    ModelStates,
    deepspeed_residuals,
    model_states,
    offload_host_buffers,
    zero12_held_elements,
)
from runner.parallel.pipeline_split import rank_param_numels
from runner.rules import offload_pair_problems


def offload_placement(offload_optimizer: Offload, offload_param: Offload) -> OffloadPlacement:
    """The config's two offload switches as one placement: none, optimizer, or optimizer+params.

    DeepSpeed offloads parameters only beside the optimizer (ZeRO-Infinity's CPU layout);
    parameters alone are refused (ValueError, in runner.rules.offload_pair_problems's words).
    """
    problems = offload_pair_problems(offload_optimizer, offload_param)
    if problems:
        raise ValueError("; ".join(problems))
    if offload_param == Offload.cpu:
        return OffloadPlacement.optimizer_and_params
    return OffloadPlacement.optimizer if offload_optimizer == Offload.cpu else OffloadPlacement.none


@dataclass(frozen=True)
class MemoryCase:
    """What one device's memory depends on: the model, precision and optimizer, the parallel
    layout's choices (:class:`runner.config.ParallelSpec`), the data-parallel degree and one
    micro-batch size; the device is the fullest rank of that layout.

    The plan (:func:`memory_terms`, from runner/plan/micro_fit.py ``memory_at``) and the measured
    ledger's estimate (runner/metrics/ledger.py) describe their device with it, and both take
    its model states, DeepSpeed's buffers and the host lines from :func:`held_states`.
    """

    model: ModelConfig
    precision: Precision
    optimizer: OptimizerName
    spec: ParallelSpec  # the ZeRO stage, tp, pp, recompute, offload and DeepSpeed's switches
    seq_len: int
    micro_size: int
    dp: int
    # Micro-batches per optimizer step. None (not known): the ledger's estimate counts the
    # offload buffer that accumulation needs; the plan needs it known.
    accum_steps: int | None = 1
    # Elements of the gradient bucket DeepSpeed is given
    # (runner.engine.deepspeed_config.reduce_bucket_elements).
    reduce_bucket_size: int = 500_000_000
    compiled: bool = False  # train.compile: the blocks' activations as their compiled graphs save them
    host_is_device: bool = False  # CPU ranks: the host memory is the device's
    # ZeRO-3 keeps parameters of at most this many elements whole on every rank: the threshold
    # DeepSpeed is given (runner.engine.deepspeed_config.persistence_threshold_elements); 0: none.
    param_persistence_threshold: int = 0

    def __post_init__(self) -> None:
        # The enums' plain values ("fp32", "adamw") are taken too, as tests and notebooks write
        # them; they are held as the members.
        for name, kind in (("precision", Precision), ("optimizer", OptimizerName)):
            object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def zero_ranks(self) -> int:
        """The ranks ZeRO partitions over: the data-parallel ranks, times the sequence-parallel
        ones, over which DeepSpeed reduces too (its sequence-data group, runner/parallel/sequence.py)."""
        return self.dp * self.spec.sp

    @property
    def rank_seq_len(self) -> int:
        """Tokens of each sample this rank runs: seq_len / sp (runner/parallel/sequence.py)."""
        return self.seq_len // self.spec.sp

    @property
    def bytes_per_elem(self) -> int:
        """Bytes of one element of the model dtype: the weights, gradients and activations."""
        return self.precision.bytes


def spec_of(parallel: ParallelConfig, recompute: Recompute) -> ParallelSpec:
    """The ParallelSpec a run's ``parallel`` group and ``model.activation_checkpointing`` set:
    the offload pair as one placement (:func:`offload_placement`), ``overlap_comm``'s null as
    the stage's DeepSpeed default."""
    stage = ZeroStage(parallel.zero_stage)
    return ParallelSpec(
        zero_stage=stage,
        tp=parallel.tp,
        pp=parallel.pp,
        sp=parallel.sp,
        recompute=recompute,
        offload=offload_placement(parallel.offload_optimizer, parallel.offload_param),
        overlap_comm=stage.overlaps_comm(parallel.overlap_comm),
        contiguous_gradients=parallel.contiguous_gradients,
        reduce_bucket_size=parallel.reduce_bucket_size,
        param_persistence_threshold=parallel.param_persistence_threshold,
    )


@dataclass(frozen=True)
class RankBatch:
    """The batch one rank steps: data-parallel ranks, micro-batch, sequence length and the
    micro-batches per step (None: not known; the estimate then counts what accumulation needs)."""

    dp: int
    micro_size: int
    seq_len: int
    accum_steps: int | None = None


def case_from_config(
    model: ModelConfig,
    spec: ParallelSpec,
    batch: RankBatch,
    *,
    precision: Precision | str,
    optimizer: OptimizerName | str,
    compiled: bool,
    host_is_device: bool,
) -> MemoryCase:
    """The MemoryCase of a run's fullest rank: the one adapter the plan and the ledger share.

    DeepSpeed's gradient bucket and ZeRO-3's persistence threshold are taken as the engine is
    given them (runner.engine.deepspeed_config ``reduce_bucket_elements``,
    ``persistence_threshold_elements``).
    """
    return MemoryCase(
        model=model,
        precision=Precision(precision),
        optimizer=OptimizerName(optimizer),
        spec=spec,
        seq_len=batch.seq_len,
        micro_size=batch.micro_size,
        dp=batch.dp,
        accum_steps=batch.accum_steps,
        reduce_bucket_size=reduce_bucket_elements(spec.reduce_bucket_size, model),
        compiled=compiled,
        host_is_device=host_is_device,
        param_persistence_threshold=persistence_threshold_elements(spec.param_persistence_threshold, model),
    )


@dataclass(frozen=True)
class HeldStates:
    """The fullest rank's model states, DeepSpeed's named buffers and its host lines, and the shape
    of one block's activations: what the plan and the ledger's estimate share (:func:`held_states`)."""

    numels: list[int]  # the rank's parameter tensors (runner.parallel.pipeline_split.rank_param_numels)
    textbook: ModelStates  # ZeRO's accounting of them (runner.memory_model.model_states)
    grads: int  # device gradient bytes: ZeRO-1/2's whole straddling tensors, else the textbook's
    residuals: dict[str, int]  # DeepSpeed's device buffers (runner.memory_model.deepspeed_residuals)
    offloaded: dict[str, int]  # the terms offload puts on the host, per rank (the non-zero ones)
    host_buffers: dict[str, int]  # ZeRO-Offload's own host buffers (runner.memory_model.offload_host_buffers)
    block: BlockShape  # one block's activations at this micro-batch (runner.memory_model.model_block_shape)

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
    numels = rank_param_numels(case.model, tp=case.spec.tp, pp=case.spec.pp)
    local, largest, stage = sum(numels), max(numels), case.spec.zero_stage
    states = model_states(
        local,
        zero_stage=stage,
        dp=case.zero_ranks,
        precision=case.precision,
        optimizer=case.optimizer,
        offload=case.spec.offload,
    )
    grads, held = states.grads, None
    if stage in (ZeroStage.zero1, ZeroStage.zero2):
        # ZeRO-1/2 keep whole the gradient of every tensor a rank's partition touches: the
        # fullest rank holds up to two straddling tensors beyond P/dp (exact, tensor by tensor).
        held = zero12_held_elements(numels, case.zero_ranks)
        if case.spec.offload == OffloadPlacement.none:
            grads = case.bytes_per_elem * held
    # DeepSpeed keeps a tensor whole when ``ds_numel <= threshold`` (0.19.8 parameter_offload.py
    # ``mark_persistent_parameters``): a tensor of exactly the threshold is kept.
    persistent = (
        sum(n for n in numels if n <= case.param_persistence_threshold) if stage.shards_parameters else 0
    )
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
            dp=case.zero_ranks,
            precision=case.precision,
            optimizer=case.optimizer,
            offload=case.spec.offload,
            reduce_bucket_size=case.reduce_bucket_size,
            persistent_params=persistent,
            largest_param=largest,
        ),
        offloaded={name: value for name, value in offloaded.items() if value},
        host_buffers=offload_host_buffers(
            local,
            zero_stage=stage,
            dp=case.zero_ranks,
            precision=case.precision,
            optimizer=case.optimizer,
            offload=case.spec.offload,
            largest_param=largest,
            held_params=held,
            accum_steps=case.accum_steps,
        ),
        block=model_block_shape(
            case.model,
            seq_len=case.rank_seq_len,
            micro_size=case.micro_size,
            tp=case.spec.tp,
            bytes_per_elem=case.bytes_per_elem,
            graph=block_graph(case.compiled, tp=case.spec.tp, zero_stage=stage),
            pp=case.spec.pp,
        ),
    )


__all__ = [
    "HeldStates",
    "MemoryCase",
    "RankBatch",
    "case_from_config",
    "held_states",
    "offload_placement",
    "spec_of",
]
