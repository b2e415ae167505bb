"""The SLURM tier: one real one-node cluster per test session (tests/slurm/cluster.py).

Outside CI a machine that cannot start it (no packages, not root) skips these tests and
says why; in CI (CI=true) the same condition fails them, so the tier cannot go quiet.
"""

from __future__ import annotations

import functools
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster import ClusterStartError, SlurmCluster, cannot_start_reason, start_cluster
from train_helpers import clean_env

ROOT = Path(__file__).resolve().parents[2]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _cannot_start(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"CI=true but the SLURM test cluster cannot start: {reason}", pytrace=False)
    pytest.skip(f"SLURM test cluster unavailable: {reason}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running one-node cluster, stopped (its own daemons only) after the session."""
    reason = cannot_start_reason()
    if reason is not None:
        _cannot_start(reason)
    try:
        cluster = start_cluster()
    except ClusterStartError as error:
        _cannot_start(str(error))
    yield cluster
    cluster.stop()


@dataclass
class SweepResult:
    """What ``python train.py -m ...`` left: exit code, output and the sweep directory."""

    returncode: int
    stdout: str
    stderr: str
    sweep_dir: Path


def _cap_address_space(cap: int) -> None:
    """``ulimit -v``: sbatch passes its caller's limits on to the job (PropagateResourceLimits=ALL)."""
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


@pytest.fixture
def sweep(slurm_cluster: SlurmCluster, tmp_path: Path):
    """Run ``python train.py -m hydra/launcher=slurm ...`` against the cluster from ``tmp_path``."""

    def _run(
        *overrides: str,
        sweep_dir: Path | None = None,
        timeout: float = 300,
        extra_env: dict[str, str] | None = None,
        address_space: int | None = None,
    ) -> SweepResult:
        directory = sweep_dir or tmp_path / "sweep"
        env = clean_env({**slurm_cluster.env(), **(extra_env or {})})
        capped = None if address_space is None else functools.partial(_cap_address_space, address_space)
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "train.py"),
                "-m",
                "hydra/launcher=slurm",
                *overrides,
                f"hydra.sweep.dir='{directory}'",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            preexec_fn=capped,
        )
        return SweepResult(proc.returncode, proc.stdout, proc.stderr, directory)

    return _run
