"""Shared fixtures; the helpers they use live in tests/train_helpers.py.

Three settings hold for every test and every process it starts (set here, before any test):

- ``LADDER_CALIBRATION``: runs and plans on ``cluster=local`` take their step-time figures from one
  recorded calibration (:data:`PINNED_CALIBRATION`, conf/cluster/local.yaml reads the variable)
  instead of measuring this host: the suite then spends no minutes measuring, and what a test sees
  of the step-time model is the same on every host and under any load. A test about the
  measurement itself asks for :func:`measured_calibration`.
- ``LADDER_SAVE_FINAL=false``: the suite's runs write no checkpoint after their last step
  (``train.save_final``'s default, conf/config.yaml reads the variable) unless a test asks for it:
  hundreds of runs would each save one that no test reads. The tests of that checkpoint ask.
- ``LADDER_CACHE_DIR``: the caches of what is still measured (those tests' figures, the CPU's MFU
  peak) are the suite's own, under .pytest_cache/, shared by every test and process of a session
  and never the user's ~/.cache/ladder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tier_clock import TierClock
from train_helpers import REFERENCE_STEPS, ROOT, SMALL_EXPERIMENT, TrainResult, run_train

# bench/calibrate_device.py on a 2-core AMD EPYC host (fp32, the tiny model's shapes): the figures
# every test plans from unless it measures this host on purpose.
PINNED_CALIBRATION = ROOT / "tests" / "data" / "cpu_calibration.json"
os.environ["LADDER_CALIBRATION"] = str(PINNED_CALIBRATION)
os.environ["LADDER_CACHE_DIR"] = str(ROOT / ".pytest_cache" / "ladder")
os.environ["LADDER_SAVE_FINAL"] = "false"


def pytest_configure(config: pytest.Config) -> None:
    """The time per tier at the end of the run, and the budget of runs (tests/tier_clock.py)."""
    clock = TierClock()
    clock.install()
    config.pluginmanager.register(clock, "tier_clock")


def pytest_unconfigure(config: pytest.Config) -> None:
    clock = config.pluginmanager.get_plugin("tier_clock")
    if clock is not None:
        clock.uninstall()


@pytest.fixture
def measured_calibration(monkeypatch):
    """This test's runs and plans measure this host's step-time figures (cached in the suite's cache)."""
    monkeypatch.delenv("LADDER_CALIBRATION")


@pytest.fixture
def no_cpu_calibration(monkeypatch):
    """Plans on cluster=local would measure the CPU for half a second; a fixed figure is enough in tests."""
    monkeypatch.setattr("runner.step_time.device_figures.measured_cpu_peak", lambda precision: 1e11)


@pytest.fixture
def train(tmp_path: Path):
    """Run train.py with overrides; each call gets its own run directory under tmp_path."""
    counter = iter(range(1000))

    def _run(*overrides: str, **kwargs: Any) -> TrainResult:
        return run_train(*overrides, run_dir=tmp_path / f"run{next(counter)}", **kwargs)

    return _run


def _session_root(tmp_path_factory) -> Path:
    """The directory every process of this pytest session shares: its base temp, or under
    pytest-xdist the folder above the workers' own base temps (pytest-xdist's documented way to
    make a session fixture run once for all workers)."""
    base: Path = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _trained_once_per_session(tmp_path_factory, overrides: tuple[str, ...]) -> TrainResult:
    """``python train.py overrides`` once in the whole session, whichever worker asks first.

    The first asker trains under an exclusive lock and leaves the result beside the run; a later
    asker, in any worker, waits for the lock and reads it. So a shared run costs one command, and
    the suite starts the same number of commands however pytest-xdist spreads the modules.
    """
    key = hashlib.sha1("\0".join(overrides).encode()).hexdigest()[:16]
    shared = _session_root(tmp_path_factory) / "trained_once"
    shared.mkdir(exist_ok=True)
    run_dir, recorded = shared / key / "run", shared / key / "result.json"
    with (shared / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not recorded.is_file():
            run_dir.parent.mkdir(exist_ok=True)
            result = run_train(*overrides, run_dir=run_dir)
            assert result.returncode == 0, (overrides, result.stderr[-3000:])
            said = {"stdout": result.stdout, "stderr": result.stderr}
            recorded.write_text(json.dumps(said))
        said = json.loads(recorded.read_text())
    return TrainResult(0, said["stdout"], said["stderr"], run_dir)


def _one_rank_run(tmp_path_factory, *overrides: str) -> TrainResult:
    """SMALL_EXPERIMENT on one plain rank for REFERENCE_STEPS steps, with ``overrides``."""
    return _trained_once_per_session(
        tmp_path_factory,
        ("parallel=ddp", "gpus=1", *overrides, *SMALL_EXPERIMENT, f"train.steps={REFERENCE_STEPS}"),
    )


@pytest.fixture(scope="session")
def trained_once(tmp_path_factory) -> Callable[..., TrainResult]:
    """Train with these overrides once per session, in whichever pytest-xdist worker asks first: a
    later test asking for the same run reads it.

    The ledger's bf16 runs on 2 ranks, for one, are also the layout tests' bf16 comparison.
    """
    return lambda *overrides: _trained_once_per_session(tmp_path_factory, overrides)


@pytest.fixture(scope="session")
def one_rank_reference(tmp_path_factory) -> TrainResult:
    """The experiment the layout tests compare against: SMALL_EXPERIMENT on one plain rank, 10 steps.

    Trained once per session; the tensor-parallel, pipeline, layout and resume modules read it.
    """
    return _one_rank_run(tmp_path_factory)


@pytest.fixture(scope="session")
def one_rank_untied_reference(tmp_path_factory) -> TrainResult:
    """The same with untied embeddings (model.tie_embeddings=false), for the untied layout tests."""
    return _one_rank_run(tmp_path_factory, "model.tie_embeddings=false")
