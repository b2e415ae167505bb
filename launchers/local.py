"""The local launcher: start ``gpus`` rank processes on this host, watch them, stop them together.

The user never types torchrun: each rank is ``python -m launchers.worker RUN_DIR`` with
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set. When one rank fails the
others are stopped after a short grace period, so a job never hangs on a collective
that a dead rank will not join.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launchers.environment import DistributedEnv
from runner.identity import RunIdentity

PROJECT_ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 5.0  # after one rank fails, how long the others get to fail or finish on their own


@dataclass(frozen=True)
class LaunchResult:
    """How the ranks ended: the first failing rank and its exit code, if any."""

    returncode: int
    failed_rank: int | None


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch_local(*, gpus: int, run_dir: Path, identity: RunIdentity) -> LaunchResult:
    """Run ``gpus`` ranks on this host and wait for all of them."""
    port = free_port()
    pythonpath = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(gpus):
        place = DistributedEnv(
            rank=rank,
            world_size=gpus,
            local_rank=rank,
            local_world_size=gpus,
            master_addr="127.0.0.1",
            master_port=port,
            source="local",
        )
        env = {**os.environ, **place.exports(), **identity.exports(), "PYTHONPATH": pythonpath}
        # `python -m` would put the user's working directory first on sys.path, where any folder
        # named like a module torch imports if present (a run directory called z3, say) shadows
        # it; the project is on PYTHONPATH, so the working directory is not needed (Python 3.11+).
        env["PYTHONSAFEPATH"] = "1"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "launchers.worker", str(run_dir)],
                env=env,
                cwd=os.getcwd(),
            )
        )
    failed_rank: int | None = None
    returncode = 0
    try:
        while any(proc.poll() is None for proc in procs):
            for rank, proc in enumerate(procs):
                code = proc.poll()
                if code not in (None, 0) and failed_rank is None:
                    failed_rank, returncode = rank, code
            if failed_rank is not None:
                deadline = time.monotonic() + GRACE_S
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(0.1)
                break
            time.sleep(0.1)
    finally:
        _stop(procs)
    if failed_rank is None:
        for rank, proc in enumerate(procs):
            if proc.returncode != 0:
                failed_rank, returncode = rank, proc.returncode
                break
    return LaunchResult(returncode=returncode, failed_rank=failed_rank)
