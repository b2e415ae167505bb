"""Bytes each rank sends (and receives) per collective and per ZeRO optimizer step.

Bandwidth-optimal ring algorithms (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", J. Parallel Distrib. Comput. 69(2); NCCL's
performance notes, nccl-tests ``doc/PERFORMANCE.md``, "bus bandwidth"): over n ranks an
all-gather or a reduce-scatter moves (n - 1)/n of the full buffer through every rank, and an
all-reduce (a reduce-scatter then an all-gather) 2(n - 1)/n. Each figure is what one rank
sends, and equally what it receives. Sizes are in bytes; divide by a link's bytes/s (one
direction) for a lower bound on the time.
"""

from __future__ import annotations

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


def alltoall_bytes(size_bytes: float, n: int) -> float:
    """Bytes one rank sends (and receives) in an all-to-all of its `size_bytes` buffer: (n-1)/n * size.

    Each rank keeps 1/n of its buffer and sends one n-th to each of the n - 1 others (nccl-tests
    ``doc/PERFORMANCE.md``, alltoall: bus bandwidth = algorithm bandwidth x (n-1)/n).
    """
    _check(size_bytes, n)
    return (n - 1) / n * size_bytes


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
    stage = ZeroStage(zero_stage)
    p_bytes = grad_bytes_per_elem if param_bytes_per_elem is None else param_bytes_per_elem
    grads = num_params * grad_bytes_per_elem
    params = num_params * p_bytes
    if not stage.shards_optimizer_states:
        return allreduce_bytes(grads, dp)
    if not stage.shards_parameters:
        return reduce_scatter_bytes(grads, dp) + allgather_bytes(params, dp)
    return reduce_scatter_bytes(grads, dp) + 2 * allgather_bytes(params, dp)


__all__ = ["allgather_bytes", "allreduce_bytes", "alltoall_bytes", "reduce_scatter_bytes", "zero_step_bytes"]
