"""Bytes each rank sends (and receives) per collective and per ZeRO optimizer step.

Bandwidth-optimal ring algorithms (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", J. Parallel Distrib. Comput. 69(2); NCCL's
performance notes, nccl-tests ``doc/PERFORMANCE.md``, "bus bandwidth"): over n ranks an
all-gather or a reduce-scatter moves (n - 1)/n of the full buffer through every rank, and an
all-reduce (a reduce-scatter then an all-gather) 2(n - 1)/n. Each figure is what one rank
sends, and equally what it receives. Sizes are in bytes; divide by a link's bytes/s (one
direction) for a lower bound on the time.

Priced (alpha-beta, :func:`priced_steps`): NCCL's tuning model (``src/graph/tuning.cc``
``ncclTopoTuneModel``) charges a collective a base latency, then a per-step latency for each
of its ring's steps (an NVLink hop inside a node, a network hop between nodes), and the bytes
above over the bus bandwidth, which nccl-tests defines so that these bytes over it are the
time (``doc/PERFORMANCE.md``: busbw = algbw x 2(n-1)/n for an all-reduce, x (n-1)/n for an
all-gather or a reduce-scatter).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from runner.config_choices import ZeroStage


def _check(size_bytes: float, n: int) -> None:
    if size_bytes < 0:
        raise ValueError(f"size_bytes={size_bytes} must be >= 0")
    if n < 1:
        raise ValueError(f"n={n} ranks must be >= 1")


def allreduce_bytes(size_bytes: float, n: int) -> float:
    """Bytes one rank sends (and receives) in a ring all-reduce of a `size_bytes` buffer: 2(n-1)/n * size."""
    _check(size_bytes, n)
    # Patarasuk & Yuan 2009: reduce-scatter + all-gather, each (n-1)/n of the buffer.
    return 2.0 * (n - 1) / n * size_bytes


def allgather_bytes(size_bytes: float, n: int) -> float:
    """Bytes one rank receives (and sends) in a ring all-gather of a `size_bytes` result: (n-1)/n * size."""
    _check(size_bytes, n)
    return (n - 1) / n * size_bytes


def reduce_scatter_bytes(size_bytes: float, n: int) -> float:
    """Bytes one rank sends (and receives) in a ring reduce-scatter of `size_bytes` input: (n-1)/n * size."""
    _check(size_bytes, n)
    return (n - 1) / n * size_bytes


class Collective(str, Enum):
    """The collectives ladder prices; each has its own ring steps (:func:`ring_steps`)."""

    all_reduce = "all-reduce"
    all_gather = "all-gather"
    reduce_scatter = "reduce-scatter"
    send_recv = "send/recv"  # a pipeline stage's point-to-point send (and its peer's receive)
    all_to_all = "all-to-all"  # sequence parallelism's exchange of heads for sequence


@dataclass(frozen=True)
class StepLatency:
    """NCCL's latencies of one collective, seconds: once per collective, and per ring step by link."""

    base_s: float
    intra_node_s: float  # one step over NVLink (or PCIe) inside a node
    inter_node_s: float  # one step over the network between nodes


def ring_steps(kind: Collective, n: int, nodes: int = 1) -> tuple[int, int]:
    """(steps, of which between nodes) of NCCL's ring ``kind`` over ``n`` ranks on ``nodes`` nodes.

    NCCL's tuning.cc (``ncclTopoTuneModel``, NVIDIA/nccl v2.30.7-1): an all-reduce takes
    2(n - 1) steps, an all-gather or a reduce-scatter n - 1; of them 2(nodes - 1), resp.
    nodes - 1, cross the network. A send is one step, over the network when it leaves its node.
    One rank takes no step.
    """
    _check(0.0, n)
    if nodes < 1 or nodes > n:
        raise ValueError(f"nodes={nodes} must be in 1..n={n}")
    if n == 1:
        return 0, 0
    if kind is Collective.send_recv:
        return 1, int(nodes > 1)
    if kind is Collective.all_to_all:
        # NCCL runs an all-to-all as a send and a receive to each peer (nccl-tests alltoall.cu,
        # ncclSend/ncclRecv per rank): n - 1 steps, to the n - n/nodes peers on other nodes
        # over the network.
        return n - 1, n - n // nodes
    if kind is Collective.all_reduce:
        return 2 * (n - 1), 2 * (nodes - 1)
    return n - 1, nodes - 1


def alltoall_bytes(size_bytes: float, n: int) -> float:
    """Bytes one rank sends (and receives) in an all-to-all of its `size_bytes` buffer: (n-1)/n * size.

    Each rank keeps 1/n of its buffer and sends one n-th to each of the n - 1 others (nccl-tests
    ``doc/PERFORMANCE.md``, alltoall: bus bandwidth = algorithm bandwidth x (n-1)/n).
    """
    _check(size_bytes, n)
    return (n - 1) / n * size_bytes


def priced_steps(
    *, steps: int, inter_steps: int, latency: StepLatency, bytes_: float = 0.0, bus_bytes_per_s: float
) -> float:
    """Seconds of one collective of ``steps`` ring steps (``inter_steps`` between nodes) moving
    ``bytes_`` per rank: base + intra x alpha_intra + inter x alpha_inter + bytes / busbw.

    NCCL's tuning.cc latency for a ring (``baseLat + (nsteps - nInterSteps) x intraLat +
    nInterSteps x interLat``) plus the bandwidth term. ``bytes_`` is what one rank sends
    (:func:`allreduce_bytes` and its kin), so over the bus bandwidth it is the time. No step
    (one rank): no time. Any collective whose steps are counted (an all-to-all too) is priced here.
    """
    if not 0 <= inter_steps <= steps:
        raise ValueError(f"inter_steps={inter_steps} must be in 0..steps={steps}")
    if bus_bytes_per_s <= 0:
        raise ValueError(f"bus_bytes_per_s={bus_bytes_per_s} must be > 0")
    if steps == 0:
        return 0.0
    alpha = latency.base_s + (steps - inter_steps) * latency.intra_node_s + inter_steps * latency.inter_node_s
    return alpha + bytes_ / bus_bytes_per_s


_BYTES = {
    Collective.all_reduce: lambda size, n: allreduce_bytes(size, n),
    Collective.all_gather: lambda size, n: allgather_bytes(size, n),
    Collective.reduce_scatter: lambda size, n: reduce_scatter_bytes(size, n),
    Collective.send_recv: lambda size, n: size if n > 1 else 0.0,
    Collective.all_to_all: lambda size, n: alltoall_bytes(size, n),
}


def collective_seconds(
    kind: Collective,
    size_bytes: float,
    n: int,
    *,
    nodes: int = 1,
    latency: StepLatency,
    bus_bytes_per_s: float,
) -> float:
    """Seconds of one ring ``kind`` of a ``size_bytes`` buffer over ``n`` ranks on ``nodes`` nodes.

    :func:`ring_steps`' steps and the bytes one rank sends, priced by :func:`priced_steps`.
    """
    steps, inter = ring_steps(kind, n, nodes)
    return priced_steps(
        steps=steps,
        inter_steps=inter,
        latency=latency,
        bytes_=_BYTES[kind](size_bytes, n),
        bus_bytes_per_s=bus_bytes_per_s,
    )


def zero_step_bytes(
    num_params: int,
    *,
    zero_stage: int,
    dp: int,
    grad_bytes_per_elem: int = 2,
    param_bytes_per_elem: int | None = None,
) -> float:
    """Bytes one rank moves per optimizer step for data parallelism under ZeRO `zero_stage`.

    ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054, Sec. 7.1-7.2), with Psi parameters:

    - stage 0 (DDP): all-reduce of the gradients, 2 Psi.
    - stages 1 and 2: reduce-scatter of the gradients (Psi) then all-gather of the updated
      parameters (Psi): 2 Psi, the same volume as DDP.
    - stage 3: parameters are all-gathered for the forward and again for the backward
      (2 Psi) and gradients reduce-scattered (Psi): 3 Psi, 1.5x DDP.

    Each Psi above is the buffer in bytes scaled by the ring factor (n - 1)/n (see
    :func:`allgather_bytes`). Gradients travel in ``grad_bytes_per_elem`` (2 for bf16/fp16,
    4 for fp32), parameters in ``param_bytes_per_elem`` (default: the same). ``dp=1``
    moves nothing.

    This is one optimizer step with one micro-batch. With gradient accumulation DeepSpeed
    0.19.8 reduces gradients once per step at stages 0-1, but at every micro-batch at stage
    2 (``stage_1_and_2.py`` ``reduce_ready_partitions_and_remove_grads``: a rank keeps only
    its partition) and stage 3, whose parameter gathers also recur every micro-batch.
    """
    if zero_stage not in tuple(ZeroStage):
        raise ValueError(f"zero_stage={zero_stage} is not one of 0, 1, 2, 3")
    if dp < 1:
        raise ValueError(f"dp={dp} must be >= 1")
    if num_params < 0:
        raise ValueError(f"num_params={num_params} must be >= 0")
    zero_stage = ZeroStage(zero_stage)
    p_bytes = grad_bytes_per_elem if param_bytes_per_elem is None else param_bytes_per_elem
    grads = num_params * grad_bytes_per_elem
    params = num_params * p_bytes
    if not zero_stage.shards_optimizer_states:
        return allreduce_bytes(grads, dp)
    if not zero_stage.shards_parameters:
        return reduce_scatter_bytes(grads, dp) + allgather_bytes(params, dp)
    return reduce_scatter_bytes(grads, dp) + 2 * allgather_bytes(params, dp)


__all__ = [
    "Collective",
    "StepLatency",
    "allgather_bytes",
    "allreduce_bytes",
    "alltoall_bytes",
    "collective_seconds",
    "priced_steps",
    "reduce_scatter_bytes",
    "ring_steps",
    "zero_step_bytes",
]
