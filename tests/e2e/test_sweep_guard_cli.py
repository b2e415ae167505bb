"""``python train.py -m`` over the global batch: refused before launch unless allowed (the sweep guard)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


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
