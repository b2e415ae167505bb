"""The sweep guard: a sweep over the global batch is refused before launch unless allowed."""

from __future__ import annotations

import pytest

from launchers.sweep_guard import FIX, cell_global_batches, refusal, sweep_cells

pytestmark = pytest.mark.unit


def test_cells_follow_basic_sweeper_order() -> None:
    # BasicSweeper's cartesian product: the first swept key varies slowest.
    assert sweep_cells(["batch.global_size=16,32", "seed=0,1", "train.steps=1"]) == [
        ["batch.global_size=16", "seed=0", "train.steps=1"],
        ["batch.global_size=16", "seed=1", "train.steps=1"],
        ["batch.global_size=32", "seed=0", "train.steps=1"],
        ["batch.global_size=32", "seed=1", "train.steps=1"],
    ]
    assert sweep_cells([]) == [[]]


def test_each_cell_gets_its_override_or_the_default() -> None:
    assert cell_global_batches(["batch.global_size=16,32", "seed=0,1", "train.steps=1"], 16) == [
        ("seed=0", 16),
        ("seed=1", 16),
        ("seed=0", 32),
        ("seed=1", 32),
    ]
    assert cell_global_batches(["seed=0,1"], 64) == [("seed=0", 64), ("seed=1", 64)]
    assert cell_global_batches(["batch.global_size=range(16,65,16)"], 8) == [
        ("", 16),
        ("", 32),
        ("", 48),
        ("", 64),
    ]
    assert [b for _, b in cell_global_batches(["batch.global_size=choice(8,16)"], 4)] == [8, 16]
    assert [b for _, b in cell_global_batches(["++batch.global_size=8,16"], 4)] == [8, 16]
    assert [b for _, b in cell_global_batches(["batch={global_size:8},{global_size:16}"], 4)] == [8, 16]


def test_same_batch_everywhere_passes() -> None:
    # A fixed override, a sweep over something else, or a one-value "sweep": one batch.
    assert refusal(["batch.global_size=32", "seed=0,1,2"], default=32, allow_varying=False) is None
    assert refusal(["parallel=ddp,zero1,zero2", "gpus=1,2"], default=16, allow_varying=False) is None
    assert refusal(["batch.global_size=16,16"], default=16, allow_varying=False) is None


def test_varying_batch_is_refused_with_cells_and_fix() -> None:
    message = refusal(["batch.global_size=16,32", "seed=0,1"], default=16, allow_varying=False)
    assert message is not None
    lines = message.splitlines()
    assert lines[0] == "ladder: refused before launch:"
    assert "  cell 0: batch.global_size=16  (seed=0)" in lines
    assert "  cell 3: batch.global_size=32  (seed=1)" in lines
    assert lines[-1] == f"  {FIX}"
    assert "batch.allow_varying=true" in FIX and "optimizer.lr_scaling=linear|sqrt" in FIX


def test_allow_varying_lets_it_through() -> None:
    assert refusal(["batch.global_size=16,32"], default=16, allow_varying=True) is None
    # Given on the command line it is in every cell too.
    overrides = ["batch.global_size=16,32", "batch.allow_varying=true"]
    assert refusal(overrides, default=16, allow_varying=False) is None
    # Swept itself, the cells that do not allow it refuse the sweep.
    overrides = ["batch.global_size=16,32", "batch.allow_varying=true,false"]
    assert refusal(overrides, default=16, allow_varying=False) is not None
