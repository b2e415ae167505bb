"""Ring collective volumes and ZeRO's per-step communication (ZeRO, arXiv 1910.02054, Sec. 7)."""

from __future__ import annotations

import pytest

from runner.comm import allgather_bytes, allreduce_bytes, reduce_scatter_bytes, zero_step_bytes

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
