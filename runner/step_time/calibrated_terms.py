"""The calibrated step time of one layout: named terms, each a count of work over a measured rate.

runner/step_time/estimate.py adds these up into the predicted step (and keeps the roofline beside
it as the bound). Every rate is the device's own, at the shape the run will use
(runner/step_time/measured/figures.py). Per optimizer step, on the fullest rank (the pipeline stage
with most layers, holding the output head), with ``accum`` micro-batches:

- ``gemm``, ``attention``, ``elementwise``, ``dispatch``: one micro-batch's compute, ``accum``
  times (runner/step_time/micro_batch_compute.py prices each).
- ``recompute``: full recompute runs every block's forward again in backward (gemm, attention,
  elementwise and dispatch forward shares); op-level selective, the matmuls it does not keep
  (runner/model/op_recompute.py: wk, wo, w3), the memory-bound kernels and their dispatch;
  attention, the attention core's (Korthikanti et al. 2022, arXiv 2205.05198, Sec. 5).
- ``loss pieces``: a loss in pieces (``model.loss_tiles``, runner.rules.loss_tile_count) runs
  the output head's GEMM and the cross-entropy forward again in backward, a piece at a time.
- ``mlp pieces``: the MLP in pieces (``model.mlp_tiles``, runner.rules.mlp_tile_count) runs every
  block's w1, w3 and w2 forward (at a piece's shape) and SwiGLU again in backward (DeepSpeed's
  TiledMLP), beside full recompute's own rerun of the block.
- ``grad accumulation``: micro-batches 2..accum add their gradients into the rank's gradient
  buffer (read two, write one per parameter).
- ``fresh memory``: a CPU's page faults on the step's tensors above glibc's mmap threshold, each
  allocated afresh every micro-batch (the logits, their gradients, the vocabulary matrices'); none
  where the rank runs on jemalloc (``train.host_allocator``), which keeps freed pages warm.
- ``engine``: DeepSpeed's engine around each micro-batch, per parameter tensor, measured against
  a bare loop (runner/step_time/measured/zero3_overhead.py ``engine_param_seconds``).
- ``optimizer``: the fused AdamW step on the rank's parameters (1/dp of them under ZeRO),
  28 bytes a parameter over its measured bandwidth, plus the passes that feed it: the
  gradient norm, the gradients' fp32 copy, the weights copied back, DeepSpeed's clip where it
  is a pass of its own (runner/step_time/optimizer_step_passes.py, one line each under the term).
- ``dp comm``, ``tp comm``, ``pp comm``: runner/step_time/estimate.py's bytes per group over the
  link, plus each collective's latency (:func:`comm_seconds`): DDP and ZeRO-1/2 reduce in
  buckets; ZeRO-3 gathers each parameter tensor in forward and backward and reduce-scatters its
  gradient, every micro-batch. Data-parallel traffic hides behind the backward with
  ``parallel.overlap_comm`` up to its length.
- ``grad flatten``: DDP's (stage 0's) flattening of the gradients for their all-reduce and the
  copy back, at the boundary; ``zero grads``: ZeRO-1/2's copies of the gradients into the
  reduce bucket and its flattening, at each reduce (runner/step_time/optimizer_step_passes.py).
- ``zero3 hooks``: ZeRO-3's module hooks and their fetch and release bookkeeping (DeepSpeed's
  ``parameter_offload`` and ``partitioned_param_coordinator``), forward and backward, paid by
  every parameter tensor they visit, persistent or not; ``zero3 fetches``: a gather's own launch,
  wait and free, paid by each gathered (not persistent) tensor. Both measured with DeepSpeed
  itself per tensor and micro-batch (``_zero3_terms`` cites the functions), or marked FITTED.
- ``zero3 gathers`` (or ``zero3 copies``): its passes over the gathered parameters' bytes
  (:data:`ZERO3_PASSES`).
- ``bubble``: a 1F1B pipeline idles (pp - 1) / accum of its compute (Narayanan et al. 2021,
  Sec. 2.2.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import OffloadPlacement, OptimizerName, Precision, Recompute, ZeroStage
from runner.engine.deepspeed_config import persistence_threshold_elements
from runner.layout import Layout
from runner.memory_model.peak_lines import layers_per_stage
from runner.parallel.pipeline_split import rank_param_numels
from runner.rules import loss_tile_count, mlp_tile_count
from runner.step_time.measured.figures import Calibration
from runner.step_time.micro_batch_compute import (
    BACKWARD_ELEMENTS,
    MicroCompute,
    gemm_caveats,
    micro_compute,
    rank_seq_len,
)
from runner.step_time.optimizer_step_passes import FLATTEN, OPTIMIZER, ZERO_GRADS, StepCopy, step_copies
from runner.step_time.workload import Knobs, Workload
from runner.step_time.zero3_reuse import layout_regathered

# ZeRO-3 per micro-batch: gather in forward, gather in backward, reduce-scatter the grad. Counted,
# not measured: DeepSpeed 0.19.8 runtime/zero/partitioned_param_coordinator.py ``fetch_sub_module``
# (forward and backward) and runtime/zero/stage3.py ``__reduce_and_partition_ipg_grads``.
ZERO3_PASSES = 3
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc malloc(3): DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts
ADAMW_BYTES = 28  # fp32 p, g, m, v read; p, m, v written


@dataclass(frozen=True)
class Term:
    """One named part of the predicted step: its seconds and, in words, what it counts."""

    name: str
    seconds: float
    words: str
    parts: tuple[Term, ...] = ()  # the lines it sums, where the plan shows them (the step's copies)
    fitted: tuple[str, ...] = ()  # calibration figures it rests on that were fitted, not measured
    count: float = 0.0  # where it is one figure paid a number of times: that number (0: not such a term)


def _fresh_rate(workload: Workload, calibration: Calibration) -> float | None:
    """Bytes per second a step writes into a large tensor allocated for it: the device's page-fault
    rate (runner/hardware/calibrate.py ``fresh_rate``); None where allocations are warm (a GPU's
    caching allocator, a CPU rank on jemalloc: runner/hardware/host_allocator.py), and a copy's
    rate applies."""
    return None if workload.keeps_freed_memory else calibration.fresh_rate()


def _fresh_term(workload: Workload, layout: Layout, calibration: Calibration) -> Term | None:
    """Page faults of the step's large fresh tensors on a CPU (runner/hardware/calibrate.py
    ``fresh_rate``): per micro-batch the logits, their log-softmax and both gradients
    (T x vocab / tp), and the vocabulary matrices' gradients (the head's and the embedding's
    dense one, vocab / tp x d_model), where each is above glibc's largest mmap threshold."""
    rate = _fresh_rate(workload, calibration)
    if rate is None:
        return None
    model, tp = workload.model, layout.tp
    elem = workload.precision.bytes
    tokens = layout.micro_size * rank_seq_len(workload, layout)
    sizes = [tokens * model.vocab_size // tp * elem] * 4 + [model.vocab_size // tp * model.d_model * elem] * 2
    if workload.precision != Precision.fp32:
        sizes += [tokens * model.vocab_size // tp * 4] * 2  # the loss's fp32 logits and their gradient
    fresh = sum(size for size in sizes if size >= MMAP_THRESHOLD_MAX)
    if not fresh:
        return None
    seconds = layout.accum_steps * fresh / rate
    return Term(
        "fresh memory",
        seconds,
        f"{fresh / 1e9:.3g} GB of page faults per micro-batch at {rate / 1e9:.3g} GB/s",
    )


def _figure_words(calibration: Calibration, figure: str) -> tuple[str, tuple[str, ...]]:
    """How a calibration figure was got, in words, and (figure,) where it was fitted, not measured."""
    fitted = calibration.fitted_words(figure)
    if fitted is not None:
        return f"FITTED, not micro-benchmarked: {fitted}", (figure,)
    return "measured with DeepSpeed", ()


def _zero3_terms(
    workload: Workload, knobs: Knobs, layout: Layout, calibration: Calibration, local: int
) -> list[Term]:
    """ZeRO-3's own work per micro-batch, as DeepSpeed 0.19.8 does it
    (runner/step_time/measured/zero3_overhead.py names each function): each tensor's hooks and
    fetches (:func:`_zero3_tensor_terms`) and the passes over the gathered parameters' bytes
    (:func:`_zero3_byte_terms`)."""
    threshold = persistence_threshold_elements(knobs.spec.param_persistence_threshold, workload.model)
    numels = rank_param_numels(workload.model, tp=layout.tp, pp=layout.pp)
    tensors = sum(1 for n in numels if n > threshold)  # gathered
    again, again_tensors = layout_regathered(workload, knobs, layout)  # gathered again in backward
    terms = _zero3_tensor_terms(
        calibration,
        accum=layout.accum_steps,
        visited=len(numels),
        tensors=tensors,
        again_tensors=again_tensors,
    )
    if not tensors:
        return terms
    gathered = sum(n for n in numels if n > threshold)
    return terms + _zero3_byte_terms(
        workload, layout, calibration, local, gathered=gathered, tensors=tensors, again=again
    )


def _zero3_tensor_terms(
    calibration: Calibration, *, accum: int, visited: int, tensors: int, again_tensors: int
) -> list[Term]:
    """ZeRO-3's work per parameter tensor, ``visited`` of them on this rank, ``tensors`` gathered:

    - ``zero3 hooks``: every parameter tensor its hooks visit, persistent or not: the four module
      hooks (runtime/zero/parameter_offload.py ``_register_deepspeed_module``) call the
      coordinator's ``fetch_sub_module`` and ``release_sub_module``
      (runtime/zero/partitioned_param_coordinator.py) for every module in forward and backward,
      which walk each tensor of the module, gathered or not, and stage 3's gradient hook
      (runtime/zero/stage3.py ``reduce_partition_and_remove_grads``) takes every gradient. The
      modules' own share is folded in per tensor (12 modules to 9 tensors in a block, as measured).
    - ``zero3 fetches``: a gathered tensor's own launch, wait and free (``__all_gather_params_``,
      its handle's ``wait``, ``__release_param``), which a tensor at or under the persistence
      threshold (``stage3_param_persistence_threshold``) never pays: it stays whole on every rank.
    """
    terms: list[Term] = []
    hooks = calibration.zero3_hook_seconds()
    if hooks is not None:
        how, fitted = _figure_words(calibration, "zero3_hook_s")
        terms.append(
            Term(
                "zero3 hooks",
                accum * visited * hooks,
                f"{visited} param tensors visited ({tensors} gathered, {visited - tensors} persistent) "
                f"x {1e3 * hooks:.3g} ms per micro-batch ({how})",
                fitted=fitted,
                count=accum * visited,
            )
        )
    gather = calibration.zero3_gather_seconds()
    if gather and tensors:
        how, fitted = _figure_words(calibration, "zero3_gather_s")
        terms.append(
            Term(
                "zero3 fetches",
                accum * (tensors + again_tensors) * gather,
                f"{tensors} param tensors gathered in forward, {again_tensors} again in backward, "
                f"x {1e3 * gather:.3g} ms per micro-batch ({how})",
                fitted=fitted,
            )
        )
    return terms


def _zero3_byte_terms(
    workload: Workload,
    layout: Layout,
    calibration: Calibration,
    local: int,
    *,
    gathered: int,
    tensors: int,
    again: int,
) -> list[Term]:
    """ZeRO-3's passes over the gathered parameters' bytes (``gathered`` elements of the rank's
    ``local`` in ``tensors`` tensors, ``again`` elements gathered again in backward): each tensor
    gathered into a whole buffer in forward and, where DeepSpeed released it
    (runner/step_time/zero3_reuse.py), again in backward, its gradient reduce-scattered out of one
    (:data:`ZERO3_PASSES`, each read and written), at the copy bandwidth; a tensor above glibc's
    mmap threshold is a fresh allocation each time, at the page-fault rate on a CPU. Where the
    device's calibration measured ZeRO-3's cost per byte (DeepSpeed at two tensor sizes), that
    figure prices the gathered bytes instead (``zero3 copies``): it holds every copy DeepSpeed
    makes of a tensor and its gradient on that device, whatever their number.
    """
    accum, elem = layout.accum_steps, workload.precision.bytes
    per_byte = calibration.zero3_byte_seconds()
    if per_byte is not None:
        gathered_bytes = elem * gathered
        return [
            Term(
                "zero3 copies",
                accum * (gathered_bytes + elem * again) * per_byte,
                f"{gathered_bytes / 1e9:.3g} GB of partitioned parameters per micro-batch "
                f"({elem * again / 1e9:.3g} GB gathered again in backward) x "
                f"{per_byte * 1e9:.3g} s/GB (measured with DeepSpeed)",
            )
        ]
    vocab = workload.model.vocab_size // layout.tp * workload.model.d_model * elem
    large = vocab * (1 if workload.model.tie_embeddings else 2) if vocab >= MMAP_THRESHOLD_MAX else 0
    copy, fresh = calibration.copy_rate(local * elem / tensors), _fresh_rate(workload, calibration)
    if copy is None:
        return []
    passes = ZERO3_PASSES - 1 + again / local  # backward gathers only what forward released
    seconds = passes * 2 * (local * elem - large) / copy
    seconds += passes * large / (fresh or copy)
    return [
        Term(
            "zero3 gathers",
            accum * seconds,
            f"{passes:.3g} passes over {local * elem / 1e9:.3g} GB of parameters per micro-batch",
        )
    ]


def _copy_seconds(copy: StepCopy, calibration: Calibration, fresh_rate: float | None) -> float | None:
    """One pass of runner/step_time/optimizer_step_passes.py: its bytes read and written at the copy
    bandwidth of a tensor its size; a fresh tensor above glibc's mmap threshold written at the
    page-fault rate on a CPU instead."""
    size = max(copy.read, copy.written) / copy.times
    rate = calibration.copy_rate(size)
    if rate is None:
        return None
    fresh = fresh_rate if copy.fresh and copy.written / copy.times >= MMAP_THRESHOLD_MAX else None
    if fresh is not None:
        return copy.read / rate + copy.written / fresh
    return (copy.read + copy.written) / rate


def _priced_copies(
    workload: Workload, knobs: Knobs, layout: Layout, calibration: Calibration, local: int
) -> list[tuple[StepCopy, float]] | None:
    """Each pass the step makes over gradients and parameters (runner/step_time/optimizer_step_passes.py)
    with its seconds (None: a figure is missing)."""
    copies = step_copies(
        zero_stage=knobs.spec.zero_stage,
        precision=workload.precision,
        offload=knobs.spec.offload,
        dp=layout.zero_ranks,
        accum_steps=layout.accum_steps,
        local=local,
    )
    fresh_rate = _fresh_rate(workload, calibration)
    priced = [(copy, _copy_seconds(copy, calibration, fresh_rate)) for copy in copies]
    if any(seconds is None for _, seconds in priced):
        return None
    return [(copy, seconds) for copy, seconds in priced if seconds is not None]


def _copy_lines(priced: list[tuple[StepCopy, float]], term: str) -> tuple[Term, ...]:
    """The passes of ``priced`` that belong to ``term``, one line each: GB read + written, and where."""
    return tuple(
        Term(copy.name, seconds, f"{(copy.read + copy.written) / 1e9:.3g} GB; {copy.source}")
        for copy, seconds in priced
        if copy.term == term
    )


def _copies_term(name: str, priced: list[tuple[StepCopy, float]], words: str) -> Term | None:
    """The passes of ``priced`` that belong to term ``name``, summed (None: the layout has none)."""
    lines = _copy_lines(priced, name)
    if not lines:
        return None
    return Term(name, sum(line.seconds for line in lines), words, parts=lines)


def _engine_term(knobs: Knobs, layout: Layout, calibration: Calibration, tensors: int) -> Term | None:
    """DeepSpeed's engine around each micro-batch on the host, per parameter tensor (measured with
    DeepSpeed against a bare loop, runner/step_time/measured/zero3_overhead.py ``engine_param_seconds``):
    its forward and backward wrappers, and ZeRO-1 and 2's gradient hooks. ZeRO-3's own hooks
    beyond stage 0's are the ``zero3 hooks`` term."""
    figures = calibration.engine_param_seconds()
    if not figures:
        return None
    stage = 0 if knobs.spec.zero_stage is ZeroStage.zero3 else int(knobs.spec.zero_stage)
    per_tensor = figures.get(str(stage))
    if per_tensor is None:
        return None
    return Term(
        "engine",
        layout.accum_steps * tensors * per_tensor,
        f"DeepSpeed's engine per micro-batch: {tensors} param tensors x {1e3 * per_tensor:.3g} ms "
        "(measured against a bare loop)",
    )


def param_tensors(workload: Workload, layout: Layout) -> int:
    """Parameter tensors on the fullest rank: 9 per block, the embedding, final norm and head."""
    return 9 * layers_per_stage(workload.model.n_layer, layout.pp) + 3


def _optimizer_term(
    workload: Workload,
    knobs: Knobs,
    layout: Layout,
    calibration: Calibration,
    local: int,
    priced: list[tuple[StepCopy, float]],
) -> Term | None:
    """The fused optimizer's own pass over the stepped parameters, at its measured bandwidth, and
    the step's passes that prepare its gradients and return its weights
    (runner/step_time/optimizer_step_passes.py)."""
    stepped = local // layout.zero_ranks if knobs.spec.zero_stage.shards_optimizer_states else local
    rate = calibration.adamw_rate(stepped)
    if rate is None:
        return None
    per_param = ADAMW_BYTES if workload.optimizer == OptimizerName.adamw else 12  # SGD: p, g, buf
    name = "AdamW" if workload.optimizer == OptimizerName.adamw else "SGD"
    own = Term(
        f"fused {name}",
        stepped * per_param / rate,
        f"{stepped * per_param / 1e9:.3g} GB: {stepped:,.0f} params x {per_param} B at {rate / 1e9:.3g} GB/s",
    )
    lines = (own, *_copy_lines(priced, OPTIMIZER))
    # runner/engine/lean_zero_step.py: under ZeRO on the device, the clip is no pass of its own
    folded = knobs.spec.zero_stage.shards_optimizer_states and knobs.spec.offload == OffloadPlacement.none
    return Term(
        "optimizer",
        sum(line.seconds for line in lines),
        f"{name} and the passes that feed it: {len(lines) - 1} below"
        + ("; the clip inside its kernel" if folded else ""),
        parts=lines,
    )


def comm_seconds(
    bytes_: float,
    collectives: int,
    *,
    bandwidth: float | None,
    calibration: Calibration | None,
    local: bool,
    gathered: float = 0.0,
    latency_s: float = 0.0,
) -> tuple[float | None, str]:
    """Seconds of ``collectives`` collectives moving ``bytes_`` per rank, and where the figures came from.

    A link of this host (ranks as processes here) takes the measured two-rank all-reduce's
    latency and bandwidth, and the measured all-gather's bandwidth for the ``gathered`` part of
    ``bytes_`` (gloo gathers slower than it reduces); any other the cluster's link bandwidth
    and ``latency_s``, NCCL's latencies of those collectives' ring steps
    (runner/step_time/estimate.py ``latency_seconds``; 0 where the cluster names none).
    """
    measured = calibration.allreduce_costs() if (calibration is not None and local) else None
    if measured is not None:
        latency, rate = measured
        gather = calibration.allgather_costs() if (calibration is not None and gathered) else None
        if gather is None:
            return collectives * latency + bytes_ / rate, "measured all-reduce on this host"
        seconds = collectives * latency + (bytes_ - gathered) / rate + gathered / gather[1]
        return seconds, "measured all-reduce and all-gather on this host"
    if bandwidth is None:
        return (0.0, "nothing to move") if bytes_ == 0 else (None, "link bandwidth unknown")
    if latency_s:
        words = f"the cluster's link bandwidth + NCCL's ring latencies {latency_s:.3g} s"
        return latency_s + bytes_ / bandwidth, words
    return bytes_ / bandwidth, "the cluster's link bandwidth"


def forward_seconds(workload: Workload, layout: Layout, calibration: Calibration) -> float | None:
    """The forward passes of one optimizer step (GEMMs, attention, memory-bound kernels, a third of
    the dispatch): what a held-out evaluation of the same batch costs (None: a figure is missing)."""
    micro = micro_compute(workload, layout, calibration)
    if micro is None:
        return None
    once = micro.gemm_forward + micro.attention_forward + micro.elementwise_forward + micro.dispatch / 3
    return layout.accum_steps * once


def _forward_again_terms(workload: Workload, knobs: Knobs, layout: Layout, micro: MicroCompute) -> list[Term]:
    """What a step runs forward again: the recompute mode's rerun, the loss's and the MLP's pieces
    (each piece's forward once more in backward), per micro-batch x accum."""
    accum, again = layout.accum_steps, []
    if knobs.spec.recompute == Recompute.full:
        redo = micro.gemm_forward + micro.attention_forward + micro.elementwise_forward + micro.dispatch / 3
        again.append(Term("recompute", accum * redo, "full: every block's forward again"))
    elif knobs.spec.recompute == Recompute.selective:
        redo = micro.reran_gemm_forward + micro.block_elementwise_forward + micro.dispatch / 3
        words = (
            "selective: wk, wo, w3 and the memory-bound kernels again (matmuls' and attention's outputs kept)"
        )
        again.append(Term("recompute", accum * redo, words))
    elif knobs.spec.recompute == Recompute.attention:
        again.append(
            Term("recompute", accum * micro.attention_forward, "attention: the attention core again")
        )
    tiles = loss_tile_count(
        workload.model,
        micro_size=layout.micro_size,
        seq_len=rank_seq_len(workload, layout),
        tp=layout.tp,
        pp=layout.pp,
    )
    if tiles > 1:
        again.append(
            Term(
                "loss pieces",
                accum * micro.loss_forward,
                f"the head and loss forward again, in {tiles} pieces",
            )
        )
    mlp_tiles = mlp_tile_count(workload.model, tokens=layout.micro_size * rank_seq_len(workload, layout))
    if mlp_tiles > 1:
        again.append(
            Term(
                "mlp pieces",
                accum * micro.mlp_forward_in_pieces,
                f"every block's MLP forward again, in {mlp_tiles} pieces (TiledMLP)",
            )
        )
    return again


def compute_terms(
    workload: Workload, knobs: Knobs, layout: Layout, calibration: Calibration
) -> list[Term] | None:
    """The compute-side terms of one optimizer step (None: a figure is missing)."""
    micro = micro_compute(workload, layout, calibration)
    if micro is None:
        return None
    accum = layout.accum_steps
    terms = [
        Term(
            "gemm",
            accum * (micro.gemm_forward + micro.gemm_backward),
            "forward + 2 backward GEMMs per linear" + gemm_caveats(workload, layout, calibration, micro),
        ),
        Term(
            "attention",
            accum * (micro.attention_forward + micro.attention_backward),
            "causal SDPA forward + backward",
        ),
        Term(
            "elementwise",
            accum * micro.elementwise_forward * (1 + BACKWARD_ELEMENTS),
            micro.elementwise_words,
        ),
        Term("dispatch", accum * micro.dispatch, micro.dispatch_words),
    ]
    terms += _forward_again_terms(workload, knobs, layout, micro)
    fresh = _fresh_term(workload, layout, calibration)
    if fresh is not None:
        terms.append(fresh)
    local = sum(rank_param_numels(workload.model, tp=layout.tp, pp=layout.pp))
    copy = calibration.copy_rate(4 * local)
    if accum > 1 and copy is not None:
        elem = workload.precision.bytes
        terms.append(
            Term(
                "grad accumulation",
                (accum - 1) * 3 * local * elem / copy,
                "micro-batches 2..accum add into the grads",
            )
        )
    priced = _priced_copies(workload, knobs, layout, calibration, local)
    if priced is None:
        return None
    optimizer = _optimizer_term(workload, knobs, layout, calibration, local, priced)
    if optimizer is None:
        return None
    terms.append(optimizer)
    return terms + _engine_terms(workload, knobs, layout, calibration, local, priced)


def _engine_terms(
    workload: Workload,
    knobs: Knobs,
    layout: Layout,
    calibration: Calibration,
    local: int,
    priced: list[tuple[StepCopy, float]],
) -> list[Term]:
    """DeepSpeed's own work at the layout's ZeRO stage: its engine per micro-batch, and the
    stage's copies of the gradients or parameters."""
    stage = knobs.spec.zero_stage
    terms = [_engine_term(knobs, layout, calibration, param_tensors(workload, layout))]
    if stage is ZeroStage.zero3:
        terms += _zero3_terms(workload, knobs, layout, calibration, local)
    elif stage in (ZeroStage.zero1, ZeroStage.zero2):
        terms.append(_copies_term(ZERO_GRADS, priced, "gradients into the reduce bucket and flattened"))
    else:
        terms.append(_copies_term(FLATTEN, priced, "gradients into a fresh flat buffer and back"))
    return [term for term in terms if term is not None]


__all__ = ["Term", "comm_seconds", "compute_terms", "forward_seconds", "param_tensors"]
