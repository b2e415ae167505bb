"""Shared fixtures; the helpers they use live in tests/train_helpers.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from train_helpers import TrainResult, run_train


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
