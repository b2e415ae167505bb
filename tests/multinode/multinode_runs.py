"""What the multinode tests train, how they start it, and how they read a run.

One experiment for the whole tier: tiny, fp32, 20 steps, one rank on each node. The sweep
test's two cells, run once, are the uninterrupted runs that every stopped job (requeued,
timed out, a node lost) must match bit for bit. A plain module beside the tests (pytest puts
this directory on sys.path), so every test module of the tier imports it by one name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train_helpers import SMALL_EXPERIMENT, clean_env
from two_nodes import TwoNodeCluster

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
# gpus=2 on nodes of one GPU each: SLURM places one rank per node (launchers/slurm/resources.py).
TWO_NODES = ["gpus=2", "cluster.gpus_per_node=1"]
CROSS_NODE = [*TWO_NODES, *SMALL_EXPERIMENT, f"train.steps={STEPS}"]
# The stopped jobs' layout: each rank saves its own ZeRO-3 partition, on its own node.
STOPPED = ["parallel=zero3", *CROSS_NODE]


def losses(run_dir: Path) -> dict[int, float]:
    """Each logged step's loss, from the run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m["loss"] for m in map(json.loads, lines)}


def summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary.json ({} before it is written)."""
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def logged_steps(run_dir: Path) -> int:
    """Steps logged so far."""
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for(what: str, ready: Callable[[], bool], timeout: float, poll: float = 0.2) -> float:
    """Wait until ``ready()``; the seconds it took. Fails with ``what`` after ``timeout``."""
    started = time.monotonic()
    while not ready():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(poll)
    return time.monotonic() - started


@dataclass
class Sweep:
    """A ``python train.py -m hydra/launcher=slurm`` running on the login node."""

    proc: subprocess.Popen[str]
    sweep_dir: Path

    @property
    def run_dir(self) -> Path:
        """The first (here: only) cell's run directory."""
        return self.sweep_dir / "0"

    def finish(self, timeout: float) -> tuple[int, str]:
        """Wait for it; its exit code and stderr (killed, with what it said, after ``timeout``)."""
        try:
            _, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stderr = self.stop()
            raise AssertionError(f"the sweep did not end within {timeout:.0f} s:\n{stderr[-4000:]}") from None
        return self.proc.returncode, stderr

    def stop(self) -> str:
        """Kill the launching process (its jobs go on in SLURM); what it said on stderr."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        _, stderr = self.proc.communicate()
        return stderr


def start_sweep(
    cluster: TwoNodeCluster, sweep_dir: Path, *overrides: str, env: dict[str, str] | None = None
) -> Sweep:
    """Start ``python train.py -m hydra/launcher=slurm overrides...`` on the login node."""
    argv = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "hydra/launcher=slurm",
        *overrides,
        f"hydra.sweep.dir='{sweep_dir}'",
    ]
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        cluster.command(argv, wd=sweep_dir.parent),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env({**cluster.env(), **(env or {})}),
        start_new_session=True,
    )
    return Sweep(proc, sweep_dir)


def job_id(run_dir: Path) -> str:
    """The SLURM job of the run (one cell: a plain job, not an array of one)."""
    return str(summary(run_dir)["slurm"]["job_id"])


def max_difference(got: dict[int, float], reference: dict[int, float]) -> float:
    """The largest |loss - reference| over the reference's steps; every step must be there."""
    assert sorted(got) == sorted(reference), (sorted(got), sorted(reference))
    return max(abs(got[step] - reference[step]) for step in reference)
