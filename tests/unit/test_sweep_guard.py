"""The sweep guard: a sweep over the global batch is refused before launch unless allowed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from launchers.sweep_guard import FIX, cell_global_batches, refusal, sweep_cells

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


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


def _train(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "WANDB_SILENT": "true"}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "-m", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[int, str, Path]]]:
    """Both CLI sweeps, started together (each pays Python and Hydra start-up)."""
    tmp = tmp_path_factory.mktemp("sweeps")
    common = ["batch.global_size=16,32", "train.steps=1", "logger=none"]
    runs = {
        "refused": (_train(*common, f"hydra.sweep.dir={tmp / 'refused'}", cwd=tmp), tmp / "refused"),
        "allowed": (
            _train(
                *common,
                "batch.allow_varying=true",
                "plan=true",
                f"hydra.sweep.dir={tmp / 'allowed'}",
                cwd=tmp,
            ),
            tmp / "allowed",
        ),
    }
    results = {}
    for name, (proc, sweep_dir) in runs.items():
        _, stderr = proc.communicate(timeout=120)
        results[name] = (proc.returncode, stderr, sweep_dir)
    yield results


def test_cli_refuses_batch_sweep_before_writing(sweeps: dict[str, tuple[int, str, Path]]) -> None:
    returncode, stderr, sweep_dir = sweeps["refused"]
    assert returncode == 2, stderr
    assert "ladder: refused before launch:" in stderr
    assert "cell 0: batch.global_size=16" in stderr and "cell 1: batch.global_size=32" in stderr
    assert "set batch.allow_varying=true to sweep the batch on purpose" in stderr
    assert not sweep_dir.exists()


def test_cli_allows_batch_sweep_on_purpose(sweeps: dict[str, tuple[int, str, Path]]) -> None:
    returncode, stderr, sweep_dir = sweeps["allowed"]
    assert returncode == 0, stderr
    assert "refused" not in stderr
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1"]
