"""Ring collective volumes and ZeRO's per-step communication (ZeRO, arXiv 1910.02054, Sec. 7)."""

from __future__ import annotations

import pytest

from runner.comm import (
    Collective,
    StepLatency,
    allgather_bytes,
    allreduce_bytes,
    collective_seconds,
    priced_steps,
    reduce_scatter_bytes,
    ring_steps,
    zero_step_bytes,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("n", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_ring_allreduce_is_two_n_minus_one_over_n(n: int, factor: float) -> None:
    """Each rank sends 2(n-1)/n of the buffer (Patarasuk & Yuan 2009)."""
    assert allreduce_bytes(1000.0, n) == pytest.approx(1000.0 * factor)


def test_allreduce_is_reduce_scatter_plus_allgather() -> None:
    """The ring all-reduce is a reduce-scatter then an all-gather, (n-1)/n each."""
    assert allgather_bytes(800, 8) == reduce_scatter_bytes(800, 8) == 700
    assert allreduce_bytes(800, 8) == reduce_scatter_bytes(800, 8) + allgather_bytes(800, 8)


def test_zero_stages_move_2psi_2psi_2psi_3psi() -> None:
    """ZeRO Sec. 7: DDP and stages 1-2 move 2 Psi per step, stage 3 3 Psi (1.5x)."""
    psi, dp = 7_500_000_000, 64
    ring = (dp - 1) / dp
    ddp = zero_step_bytes(psi, zero_stage=0, dp=dp)
    assert ddp == pytest.approx(2 * psi * 2 * ring)  # 2 bytes per bf16 gradient
    assert zero_step_bytes(psi, zero_stage=1, dp=dp) == pytest.approx(ddp)
    assert zero_step_bytes(psi, zero_stage=2, dp=dp) == pytest.approx(ddp)
    assert zero_step_bytes(psi, zero_stage=3, dp=dp) == pytest.approx(1.5 * ddp)


def test_zero_step_bytes_dtypes_and_single_rank() -> None:
    """fp32 doubles the volume; one rank moves nothing; parameters may travel in their own dtype."""
    assert zero_step_bytes(1000, zero_stage=0, dp=2, grad_bytes_per_elem=4) == 4000
    assert zero_step_bytes(10**9, zero_stage=3, dp=1) == 0
    mixed = zero_step_bytes(1000, zero_stage=1, dp=2, grad_bytes_per_elem=4, param_bytes_per_elem=2)
    assert mixed == 1000 * 4 / 2 + 1000 * 2 / 2


def test_bad_inputs_are_rejected() -> None:
    """Stage, dp and sizes are checked."""
    with pytest.raises(ValueError, match="zero_stage"):
        zero_step_bytes(10, zero_stage=4, dp=2)
    with pytest.raises(ValueError, match="dp"):
        zero_step_bytes(10, zero_stage=1, dp=0)
    with pytest.raises(ValueError, match="ranks"):
        allreduce_bytes(10, 0)


# NCCL tuning.cc's Ring/Simple figures (conf/cluster/*.yaml), in seconds.
NCCL = StepLatency(base_s=8.4e-6, intra_node_s=3.4e-6, inter_node_s=14e-6)


@pytest.mark.parametrize(
    ("kind", "n", "nodes", "steps"),
    [
        (Collective.all_reduce, 16, 2, (30, 2)),  # 2(n-1) steps, 2(nodes-1) between nodes
        (Collective.all_gather, 16, 2, (15, 1)),  # n-1, nodes-1
        (Collective.reduce_scatter, 8, 1, (7, 0)),
        (Collective.send_recv, 2, 2, (1, 1)),
        (Collective.all_reduce, 1, 1, (0, 0)),
    ],
)
def test_ring_steps_are_nccl_tuning_models(
    kind: Collective, n: int, nodes: int, steps: tuple[int, int]
) -> None:
    """NCCL's tuning.cc: nsteps and nInterSteps of a ring."""
    assert ring_steps(kind, n, nodes) == steps


def test_an_all_reduce_across_two_nodes_is_priced_by_hand() -> None:
    """1 GB over 16 ranks on 2 nodes at 400 GB/s bus bandwidth: 8.4 + 28 x 3.4 + 2 x 14 = 131.6 us
    of latency, and 2 x 15/16 x 1 GB / 400 GB/s = 4.6875 ms of bytes."""
    seconds = collective_seconds(Collective.all_reduce, 1e9, 16, nodes=2, latency=NCCL, bus_bytes_per_s=400e9)
    assert seconds == pytest.approx(131.6e-6 + 4.6875e-3)
    gather = collective_seconds(Collective.all_gather, 8e6, 8, latency=NCCL, bus_bytes_per_s=450e9)
    assert gather == pytest.approx(8.4e-6 + 7 * 3.4e-6 + 7e6 / 450e9)  # n-1 NVLink steps, 7/8 of the bytes


def test_one_rank_takes_no_time_and_an_empty_collective_its_latency_alone() -> None:
    """A collective over one rank is no collective; one with no bytes still pays its steps."""
    assert collective_seconds(Collective.all_reduce, 1e9, 1, latency=NCCL, bus_bytes_per_s=1e9) == 0.0
    empty = priced_steps(steps=14, inter_steps=0, latency=NCCL, bus_bytes_per_s=1e9)
    assert empty == pytest.approx(8.4e-6 + 14 * 3.4e-6)
    with pytest.raises(ValueError, match=r"inter_steps=3 must be in 0\.\.steps=2"):
        priced_steps(steps=2, inter_steps=3, latency=NCCL, bus_bytes_per_s=1e9)
