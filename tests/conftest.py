"""Shared fixtures; the helpers they use live in tests/train_helpers.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from train_helpers import REFERENCE_STEPS, SMALL_EXPERIMENT, TrainResult, run_train

from runner.cuda_devices import gpu_driver_present

# DeepSpeed builds its CPU ops on first use (torch's JIT, into TORCH_EXTENSIONS_DIR): on a
# fresh machine about 1.5 min for CPU Adam and 1 min for the shared-memory collectives.
# Started as the session begins, the build uses the core the single-process tests leave idle;
# a rank that needs an op before it is built waits on torch's build lock, as it would anyway.
BUILD_CPU_OPS = (
    "from deepspeed.accelerator import get_accelerator\n"
    "for name in ('ShareMemCommBuilder', 'CPUAdamBuilder'):\n"
    "    get_accelerator().create_op_builder(name).load(verbose=False)\n"
)
_BUILD = pytest.StashKey[subprocess.Popen]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build DeepSpeed's CPU ops in the background when a multi-rank test will need them."""
    needs_ops = any(item.get_closest_marker("multirank") for item in session.items)
    if not needs_ops or gpu_driver_present():
        return
    session.config.stash[_BUILD] = subprocess.Popen(
        [sys.executable, "-c", BUILD_CPU_OPS],
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Let a build still running finish, so that no half-written op is left behind."""
    build = session.config.stash.get(_BUILD, None)
    if build is not None:
        build.wait()


@pytest.fixture
def no_cpu_calibration(monkeypatch):
    """Plans on cluster=local would measure the CPU for half a second; a fixed figure is enough in tests."""
    monkeypatch.setattr("runner.plan_hardware.measured_cpu_peak", lambda precision: 1e11)


@pytest.fixture
def train(tmp_path: Path):
    """Run train.py with overrides; each call gets its own run directory under tmp_path."""
    counter = iter(range(1000))

    def _run(*overrides: str, **kwargs: Any) -> TrainResult:
        return run_train(*overrides, run_dir=tmp_path / f"run{next(counter)}", **kwargs)

    return _run


def _one_rank_run(tmp_path_factory, name: str, *overrides: str) -> TrainResult:
    """SMALL_EXPERIMENT on one plain rank for REFERENCE_STEPS steps, with ``overrides``."""
    run_dir = tmp_path_factory.mktemp(name) / "run"
    result = run_train(
        "parallel=ddp",
        "gpus=1",
        *overrides,
        *SMALL_EXPERIMENT,
        f"train.steps={REFERENCE_STEPS}",
        run_dir=run_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="session")
def one_rank_reference(tmp_path_factory) -> TrainResult:
    """The experiment the layout tests compare against: SMALL_EXPERIMENT on one plain rank, 10 steps.

    Trained once per session; the tensor-parallel, pipeline, layout and resume modules read it.
    """
    return _one_rank_run(tmp_path_factory, "one_rank_reference")


@pytest.fixture(scope="session")
def one_rank_untied_reference(tmp_path_factory) -> TrainResult:
    """The same with untied embeddings (model.tie_embeddings=false), for the untied layout tests."""
    return _one_rank_run(tmp_path_factory, "one_rank_untied_reference", "model.tie_embeddings=false")
