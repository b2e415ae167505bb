"""One layout's step time and MFU, predicted and bounded, and the bytes each device communicates.

The bound is a roofline, not a simulation: compute runs at the device's peak, each
collective at its link's bandwidth, and what is not overlapped adds up. It is an optimistic
bound: real steps are slower (kernel efficiency, latency, stragglers), so its MFU
is the most a layout could reach, useful to rank layouts against each other.

Bytes (what one device sends, equally what it receives; runner.comm's ring figures):

- data parallel, ZeRO (runner.comm.zero_step_bytes, Rajbhandari et al. 2019, arXiv
  1910.02054, Sec. 7): stages 0-1 reduce gradients once per step; stage 2 reduce-scatters
  gradients at every micro-batch (DeepSpeed keeps only a partition) and all-gathers the
  updated parameters once; stage 3 repeats its gathers and reduce-scatter every micro-batch.
- tensor parallel (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3, the f and g operators):
  per layer and micro-batch two all-reduces of the (s, b, h) activations in the forward
  and two in the backward; full recompute reruns the forward, two more. Outside the
  blocks the vocabulary-split output head all-reduces its input gradient, and the
  vocabulary-split embedding its lookup.
- pipeline parallel (Narayanan et al. 2021, arXiv 2104.04473, Sec. 2.2): per micro-batch a
  stage sends its (s, b, h) output forward and the gradient of its input backward.
- sequence parallel (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509, Sec. 3.1;
  runner/parallel/sequence.py): per layer and micro-batch four all-to-alls forward (the
  query, key and value pieces, then the attention's output) and their four transposes in
  backward; full recompute reruns the forward's four. Each moves (sp - 1)/sp of the rank's
  (s/sp, b, heads x head size) piece, the key's and value's at the key/value heads' width.

Time: compute = tokens x (model + recomputed FLOPs per token) / (gpus x peak); the 1F1B
pipeline bubble adds (pp - 1) / accum of it (Narayanan et al. 2021, Sec. 2.2.1); each
group's bytes go over its link. Data-parallel traffic stays within a node when all ranks
fit in one (gpus <= gpus_per_node), else it crosses nodes, where NCCL's rings run over every
port of a node at once (runner/step_time/device_figures.py ``rails_bandwidth``: min(NVLink, ports x
port)); a pipeline's send across nodes takes one device's share of its node's ports; tensor
parallel stays inside a node. With ``parallel.overlap_comm`` the data-parallel traffic hides
behind compute up to the compute time; tensor- and pipeline-parallel traffic is on the
critical path.

That roofline is kept as the *bound*. The *prediction* is runner/step_time/calibrated_terms.py's named
terms on the device's calibration (runner/step_time/measured/figures.py): what each GEMM, kernel, copy,
optimizer step and collective takes on that device, at the run's shapes. Without a
calibration (none measured, none recorded for the cluster) the prediction is the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runner.comm import (
    Collective,
    StepLatency,
    allgather_bytes,
    allreduce_bytes,
    alltoall_bytes,
    priced_steps,
    reduce_scatter_bytes,
    ring_steps,
    zero_step_bytes,
)
from runner.config import ModelConfig, Recompute, ZeroStage
from runner.flops import flops_per_token, mfu, non_embedding_params, recompute_flops_per_token
from runner.layout import Layout
from runner.memory_model.peak_lines import layers_per_stage
from runner.model.shape import n_kv_head
from runner.parallel.pipeline_split import rank_param_numels
from runner.step_time.calibrated_terms import (
    Term,
    comm_seconds,
    compute_terms,
    forward_seconds,
    param_tensors,
)
from runner.step_time.device_figures import Device
from runner.step_time.workload import Knobs, Workload
from runner.step_time.zero3_reuse import layout_regathered


@dataclass(frozen=True)
class Traffic:
    """Bytes one device moves per optimizer step in one parallel group, and over which link."""

    group: str  # "dp", "tp", "pp" or "sp"
    bytes: float
    link: str  # "intra-node" or "inter-node"
    bandwidth: float | None  # bytes/s one direction; None: unknown
    detail: str
    gathered: float = 0.0  # of ``bytes``, those all-gathered (the rest all-reduced or reduce-scattered)
    ranks: int = 1  # ranks in one of the group's collectives
    nodes: int = 1  # nodes those ranks span: the ring's steps between nodes (runner.comm.ring_steps)

    @property
    def seconds(self) -> float | None:
        """Time on the link at full bandwidth; None when the bandwidth is unknown."""
        if self.bytes == 0:
            return 0.0
        if self.bandwidth is None:
            return None
        return self.bytes / self.bandwidth


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one optimizer step and the MFU it implies (None: peak unknown).

    With a calibration, ``step_s`` is the sum of ``terms`` (runner/step_time/calibrated_terms.py); the
    roofline stays beside it as ``bound_step_s`` / ``bound_mfu``. Without one they are equal.
    """

    compute_s: float | None
    bubble_s: float | None
    comm_s: float | None  # exposed communication; None: a needed bandwidth is unknown
    step_s: float | None  # None when compute is unknown; a lower bound when comm_s is None
    mfu: float | None  # an upper bound when comm_s is None
    tokens_per_s: float | None
    terms: tuple[Term, ...] = ()
    bound_step_s: float | None = None  # the roofline: compute at peak, links at full bandwidth
    bound_mfu: float | None = None
    forward_s: float | None = None  # the step's forward passes alone (calibrated; None: the bound's share)
    calibration: str = ""  # where the terms' figures came from ("": no calibration, the bound)

    @property
    def complete(self) -> bool:
        """True when every part of the step could be predicted."""
        return self.step_s is not None and self.comm_s is not None

    @property
    def limit(self) -> str | None:
        """The term that takes most of the predicted step (None: no terms)."""
        if not self.terms:
            return None
        return max(self.terms, key=lambda t: t.seconds).name


def _link(device: Device, *, inside_node: bool, p2p: bool = False) -> tuple[str, float | None]:
    """The link and bandwidth of a ring collective (or with ``p2p``, a point-to-point send)."""
    if inside_node:
        return "intra-node", device.intra_node_bytes_per_s.value
    if p2p:
        return "inter-node", device.inter_node_p2p_bytes_per_s.value
    return "inter-node", device.inter_node_bytes_per_s.value


def traffic(workload: Workload, knobs: Knobs, layout: Layout) -> list[Traffic]:
    """Bytes per optimizer step per device of each parallel group in use (see the module docstring)."""
    model, device, accum_steps = workload.model, workload.device, layout.accum_steps
    # Gradients and parameters travel in the compute dtype.
    elem = workload.precision.bytes
    within = layout.gpus <= device.per_node
    groups = [_dp_traffic(workload, knobs, layout, elem=elem)]
    activation = workload.seq_len * layout.micro_size * model.d_model * elem  # one (s, b, h) tensor
    if layout.tp > 1:
        per_layer = 6 if knobs.spec.recompute == Recompute.full else 4  # Shoeybi et al. 2019: f, g fwd + bwd
        # The vocabulary-parallel head's input gradient and the embedding's lookup; the loss's
        # per-token all-reduces are (s, b) only.
        outside = 2
        count = layers_per_stage(model.n_layer, layout.pp) * per_layer + outside
        groups.append(
            Traffic(
                "tp",
                accum_steps * count * allreduce_bytes(activation, layout.tp),
                *_link(device, inside_node=layout.tp <= device.per_node),
                f"{per_layer} all-reduces of (s, b, h) per layer and micro-batch, {outside} for the "
                "vocabulary-split head and embedding",
                ranks=layout.tp,
                nodes=math.ceil(layout.tp / device.per_node),
            )
        )
    if layout.pp > 1:
        groups.append(
            Traffic(
                "pp",
                accum_steps * 2.0 * activation,
                *_link(device, inside_node=within, p2p=True),
                "activation out + gradient back per micro-batch",
                ranks=2,
                nodes=1 if within else 2,
            )
        )
    if layout.sp > 1:
        groups.append(_sp_traffic(workload, knobs, layout, elem=elem))
    return groups


def sp_alltoalls_per_layer(recompute: Recompute) -> int:
    """All-to-alls per layer and micro-batch under sequence parallelism: q, k, v and the output in
    forward, their transposes in backward, the forward's again under full recompute."""
    return 12 if recompute == Recompute.full else 8


def _sp_traffic(workload: Workload, knobs: Knobs, layout: Layout, *, elem: int) -> Traffic:
    """The sequence-parallel group's bytes per step: Ulysses' all-to-alls (module docstring)."""
    model, sp = workload.model, layout.sp
    piece = layout.micro_size * workload.seq_len // sp * elem  # bytes per feature of one rank's piece
    head_dim = model.d_model // model.n_head
    kv_width = n_kv_head(model) * head_dim
    forward = alltoall_bytes(piece * (2 * model.d_model + 2 * kv_width), sp)  # q and out, k and v
    per_layer = sp_alltoalls_per_layer(knobs.spec.recompute)
    passes = per_layer / 4  # each pass moves the four pieces once
    layers = layers_per_stage(model.n_layer, layout.pp)
    inside = sp <= workload.device.per_node
    return Traffic(
        "sp",
        layout.accum_steps * layers * passes * forward,
        *_link(workload.device, inside_node=inside),
        f"{per_layer} all-to-alls of the (s/sp, b, heads) pieces per layer and micro-batch",
        ranks=sp,
        nodes=math.ceil(sp / workload.device.per_node),
    )


def _dp_traffic(workload: Workload, knobs: Knobs, layout: Layout, *, elem: int) -> Traffic:
    """The data-parallel group's bytes per step: ZeRO's collectives over the fullest rank's parameters."""
    stage, dp, accum_steps = knobs.spec.zero_stage, layout.zero_ranks, layout.accum_steps
    local = fullest_rank_params(workload, layout)
    once = zero_step_bytes(local, zero_stage=stage, dp=dp, grad_bytes_per_elem=elem)
    again, _ = layout_regathered(workload, knobs, layout)  # gathered again in backward
    if stage.shards_parameters:
        # zero_step_bytes counts every parameter gathered twice; backward gathers only those
        # DeepSpeed released after forward (runner/step_time/zero3_reuse.py)
        once += allgather_bytes(again * elem, dp) - allgather_bytes(local * elem, dp)
        share = f"{again / local:.0%}" if local else "0%"
        how = (
            f"params gathered, {share} again in backward, grads reduce-scattered, "
            f"per micro-batch x accum {accum_steps}"
        )
        dp_bytes = accum_steps * once
    elif stage.shards_gradients:
        extra = (accum_steps - 1) * reduce_scatter_bytes(local * elem, dp)
        dp_bytes, how = once + extra, f"grads reduce-scattered per micro-batch x accum {accum_steps}"
    else:
        dp_bytes, how = once, "gradients reduced once per step"
    if workload.device.is_host and stage.shards_optimizer_states:
        # CPU ranks talk over gloo (runner/engine/distributed.py), which has no reduce-scatter:
        # DeepSpeed's ZeRO-1/2 all-reduce the gradient bucket, and torch's gloo
        # ``_reduce_scatter_base`` (ZeRO-3) all-reduces the whole buffer and keeps its part.
        reduces = accum_steps if stage.shards_gradients else 1
        grads = local * elem
        dp_bytes += reduces * (allreduce_bytes(grads, dp) - reduce_scatter_bytes(grads, dp))
        how += "; gloo all-reduces where ZeRO reduce-scatters"
    # ZeRO-1/2 gather the updated parameters once a step; ZeRO-3 gathers them in forward every
    # micro-batch, and again in backward those it released (runner/step_time/zero3_reuse.py).
    gathers = {ZeroStage.zero1: 1, ZeroStage.zero2: 1, ZeroStage.zero3: accum_steps}.get(stage, 0)
    gathered = gathers * allgather_bytes(local * elem, dp) + accum_steps * allgather_bytes(again * elem, dp)
    per_node = workload.device.per_node
    within = layout.gpus <= per_node
    where = f"{layout.gpus} gpus {'<=' if within else '>'} {per_node} per node"
    link = _link(workload.device, inside_node=within)
    # DeepSpeed's topology puts tp fastest, then dp (PipeModelDataParallelTopology's axes pipe,
    # data, model): a node holds per_node // tp ranks of one data-parallel group.
    nodes = 1 if within else min(dp, math.ceil(dp / max(1, per_node // layout.tp)))
    return Traffic(
        "dp", dp_bytes, *link, f"ZeRO-{int(stage)}: {how}; {where}", gathered=gathered, ranks=dp, nodes=nodes
    )


def fullest_rank_params(workload: Workload, layout: Layout) -> int:
    """Parameters of the fullest rank's tensor and pipeline part, before ZeRO shards them."""
    return sum(rank_param_numels(workload.model, tp=layout.tp, pp=layout.pp))


def model_flops_per_token(
    model: ModelConfig, *, num_params: int, seq_len: int, causal: bool = False
) -> float:
    """Model FLOPs per token, 6N + 12*L*h*s (PaLM appendix B; N without an untied input embedding);
    ``causal``: the attention term halved, as a causal mask computes it (runner.flops.flops_per_token)."""
    n = non_embedding_params(
        num_params, vocab_size=model.vocab_size, d_model=model.d_model, tie_embeddings=model.tie_embeddings
    )
    return flops_per_token(
        num_params=n, n_layers=model.n_layer, d_model=model.d_model, seq_len=seq_len, causal=causal
    )


def causal_share(model: ModelConfig, *, num_params: int, seq_len: int) -> float:
    """The causal count of a token's FLOPs over PaLM's full one: MFU x this is the MFU a run logs as
    ``throughput/mfu_causal`` (runner/metrics/throughput.py)."""
    full = model_flops_per_token(model, num_params=num_params, seq_len=seq_len)
    return model_flops_per_token(model, num_params=num_params, seq_len=seq_len, causal=True) / full


def _recomputed_flops_per_token(workload: Workload, recompute: Recompute) -> float:
    """Forward FLOPs per token that recompute redoes in backward (runner.flops.recompute_flops_per_token)."""
    model = workload.model
    n = non_embedding_params(
        workload.num_params,
        vocab_size=model.vocab_size,
        d_model=model.d_model,
        tie_embeddings=model.tie_embeddings,
    )
    return recompute_flops_per_token(
        num_params=n,
        n_layers=model.n_layer,
        d_model=model.d_model,
        seq_len=workload.seq_len,
        recompute=recompute,
        kv_width=model.d_model * n_kv_head(model) // model.n_head,
        ffn_hidden=model.ffn_hidden,
    )


def step_time(workload: Workload, knobs: Knobs, layout: Layout, groups: list[Traffic]) -> StepTime:
    """The predicted step (calibrated terms) beside the roofline bound; see the module docstring."""
    bound = roofline(workload, knobs, layout, groups)
    calibration = workload.device.calibration
    if calibration is None or bound.step_s is None:
        return bound
    terms = compute_terms(workload, knobs, layout, calibration)
    if terms is None:
        return bound
    compute = sum(t.seconds for t in terms)
    tensors = param_tensors(workload, layout)
    _, again = layout_regathered(workload, knobs, layout)
    local = fullest_rank_params(workload, layout)
    exposed: float | None = 0.0
    for group in groups:
        counts = collectives(group.group, knobs, layout, tensors, regathered=again, local_params=local)
        count = sum(counts.values())
        seconds, how = comm_seconds(
            group.bytes,
            count,
            latency_s=latency_seconds(counts, group, workload.device.step_latency),
            bandwidth=group.bandwidth,
            calibration=calibration,
            local=calibration.measure is not None and group.link == "intra-node",
            gathered=group.gathered,
        )
        if seconds is None:
            exposed = None
            continue
        if group.group == "dp" and knobs.spec.overlap_comm:
            seconds = max(0.0, seconds - compute)
        terms.append(
            Term(f"{group.group} comm", seconds, f"{count} collectives, {group.bytes / 1e9:.3g} GB; {how}")
        )
        if exposed is not None:
            exposed += seconds
    # Narayanan et al. 2021 (arXiv 2104.04473), Sec. 2.2.1: bubble / ideal time = (p - 1) / m.
    bubble = compute * (layout.pp - 1) / layout.accum_steps
    if bubble:
        terms.append(
            Term(
                "bubble", bubble, f"1F1B: (pp - 1) / accum = {layout.pp - 1}/{layout.accum_steps} of compute"
            )
        )
    step = sum(t.seconds for t in terms)
    tokens = layout.global_size * workload.seq_len
    peak = workload.device.peak_flops.value
    assert peak is not None  # the bound has a step only with a peak
    model_fpt = model_flops_per_token(
        workload.model, num_params=workload.num_params, seq_len=workload.seq_len
    )
    utilisation = mfu(
        tokens_per_s=tokens / step,
        flops_per_token=model_fpt,
        peak_flops_per_device=peak,
        n_devices=layout.gpus,
    )
    return StepTime(
        compute,
        bubble,
        exposed,
        step,
        utilisation,
        tokens / step,
        terms=tuple(terms),
        bound_step_s=bound.step_s,
        bound_mfu=bound.mfu,
        calibration=calibration.describe(),
        forward_s=forward_seconds(workload, layout, calibration),
    )


# DeepSpeed 0.19.8 runtime/engine.py: without ZeRO, ``allreduce_gradients`` all-reduces in
# buffers of MEMORY_OPT_ALLREDUCE_SIZE elements, whatever reduce_bucket_size says.
DDP_BUCKET_ELEMENTS = 500_000_000


def collectives(
    group: str,
    knobs: Knobs,
    layout: Layout,
    param_tensors: int,
    *,
    regathered: int = 0,
    local_params: int = 0,
) -> dict[Collective, int]:
    """Collectives of each kind one rank takes part in per step, in ``group``: each pays NCCL's latency.

    Gradients are reduced in buckets of ``local_params`` gradients: DDP (DeepSpeed's stage 0)
    all-reduces them in buffers of :data:`DDP_BUCKET_ELEMENTS`, ZeRO reduce-scatters them in
    buckets of ``parallel.reduce_bucket_size`` elements (stage_1_and_2.py and stage3.py fill
    their bucket and reduce it when the next gradient would overflow it), once a step at
    ZeRO-1 and every micro-batch at ZeRO-2 and 3. ZeRO-1/2 gather the updated parameters
    once a step; ZeRO-3 gathers each parameter tensor in forward and the ``regathered`` ones
    again in backward (runner/step_time/zero3_reuse.py), every micro-batch. Tensor parallel:
    ``traffic``'s all-reduces; pipeline: a send and a receive per micro-batch.
    """
    accum = layout.accum_steps
    stage = knobs.spec.zero_stage
    if group == "dp":
        if layout.zero_ranks == 1:
            return {}
        if not stage.shards_optimizer_states:
            return {Collective.all_reduce: max(1, math.ceil(local_params / DDP_BUCKET_ELEMENTS))}
        buckets = max(1, math.ceil(local_params / knobs.spec.reduce_bucket_size))
        if stage.shards_parameters:
            return {
                Collective.all_gather: (param_tensors + regathered) * accum,
                Collective.reduce_scatter: buckets * accum,
            }
        reduces = accum if stage.shards_gradients else 1
        return {Collective.reduce_scatter: buckets * reduces, Collective.all_gather: 1}
    if group == "tp":
        per_layer = 6 if knobs.spec.recompute == Recompute.full else 4
        layers = (param_tensors - 3) // 9  # runner/step_time/calibrated_terms.py param_tensors: 9 per block
        return {Collective.all_reduce: accum * (layers * per_layer + 2)}
    if group == "sp":
        layers = (param_tensors - 3) // 9
        return {Collective.all_to_all: accum * layers * sp_alltoalls_per_layer(knobs.spec.recompute)}
    return {Collective.send_recv: 2 * accum}


def latency_seconds(counts: dict[Collective, int], group: Traffic, latency: StepLatency | None) -> float:
    """NCCL's latency of ``counts`` collectives over ``group``'s ranks and nodes (0: latency unknown).

    Each collective's ring steps priced by runner.comm.priced_steps with no bytes: the bytes of
    all of them go over the link once, in runner/step_time/calibrated_terms.py ``comm_seconds``,
    which is the same sum as pricing each with its own bytes.
    """
    if latency is None or group.bandwidth is None:
        return 0.0
    total = 0.0
    for kind, count in counts.items():
        steps, inter = ring_steps(kind, group.ranks, group.nodes)
        total += count * priced_steps(
            steps=steps, inter_steps=inter, latency=latency, bus_bytes_per_s=group.bandwidth
        )
    return total


def roofline(workload: Workload, knobs: Knobs, layout: Layout, groups: list[Traffic]) -> StepTime:
    """The bound: compute at peak + pipeline bubble + exposed communication at full bandwidth."""
    gpus, pp, accum_steps = layout.gpus, layout.pp, layout.accum_steps
    overlap_comm, peak_flops = knobs.spec.overlap_comm, workload.device.peak_flops.value
    tokens = layout.global_size * workload.seq_len
    model_fpt = model_flops_per_token(
        workload.model, num_params=workload.num_params, seq_len=workload.seq_len
    )
    redo = _recomputed_flops_per_token(workload, knobs.spec.recompute)
    seconds = {g.group: g.seconds for g in groups}
    comm: float | None = None
    if all(s is not None for s in seconds.values()):
        comm = sum(s for s in seconds.values() if s is not None)
    if peak_flops is None:
        return StepTime(None, None, comm, None, None, None)
    compute = tokens * (model_fpt + redo) / (gpus * peak_flops)
    # Narayanan et al. 2021 (arXiv 2104.04473), Sec. 2.2.1: bubble / ideal time = (p - 1) / m.
    bubble = compute * (pp - 1) / accum_steps
    known = 0.0
    for group, s in seconds.items():
        if s is None:
            continue
        known += max(0.0, s - compute) if (group == "dp" and overlap_comm) else s
    exposed = known if comm is not None else None
    step = compute + bubble + known
    # PaLM (arXiv 2204.02311) appendix B: MFU = model FLOP/s achieved / aggregate peak.
    utilisation = mfu(
        tokens_per_s=tokens / step,
        flops_per_token=model_fpt,
        peak_flops_per_device=peak_flops,
        n_devices=gpus,
    )
    return StepTime(
        compute, bubble, exposed, step, utilisation, tokens / step, bound_step_s=step, bound_mfu=utilisation
    )


def eval_time(workload: Workload, knobs: Knobs, layout: Layout, step: StepTime) -> float | None:
    """Predicted seconds of one held-out evaluation (runner/train/evaluation.py): train.eval_batches
    global batches, forward only, with a pipeline's inference bubble; None where the step's compute
    is unknown. Calibrated, the step's forward terms (``StepTime.forward_s``); on the bound:

    A forward pass is one third of a step's model FLOPs (2N of 6N per token: Kaplan et al. 2020,
    Sec. 2.1) and recomputes nothing, so it takes compute x (model/3) / (model + recomputed) of the
    step's compute. The bubble fraction (p - 1) / m is the step's (Narayanan et al. 2021).
    """
    forward = step.forward_s
    if forward is None:
        if step.compute_s is None:
            return None
        model_fpt = model_flops_per_token(
            workload.model, num_params=workload.num_params, seq_len=workload.seq_len
        )
        redo = _recomputed_flops_per_token(workload, knobs.spec.recompute)
        forward = step.compute_s * (model_fpt / 3) / (model_fpt + redo)
    return workload.eval_batches * forward * (1 + (layout.pp - 1) / layout.accum_steps)


__all__ = [
    "StepTime",
    "Term",
    "Traffic",
    "collectives",
    "eval_time",
    "fullest_rank_params",
    "latency_seconds",
    "model_flops_per_token",
    "roofline",
    "step_time",
    "traffic",
]
