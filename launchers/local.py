"""The local launcher: start ``gpus`` rank processes on this host, watch them, stop them together.

The user never types torchrun: each rank is ``python -m launchers.worker RUN_DIR`` with
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, and reads the job the
launching process decided (the typed config, its layout, DeepSpeed's config) from its
standard input, pickled: no rank composes or converts the config again. When one rank fails the
others are stopped after a short grace period, so a job never hangs on a collective
that a dead rank will not join.

Stopping a run: at SIGINT (Ctrl-C, which the terminal sends the ranks too), SIGTERM or
SIGHUP this process passes the signal on to the ranks (SIGHUP as SIGTERM), which finish their
step, save a checkpoint together and exit 75 (runner/exit_codes.py); ``train.resume=auto`` continues
the run from there. A second signal kills the ranks at once. Should this process die
regardless, the kernel sends each rank SIGTERM (launchers/worker.py), so no rank trains on
alone.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from launchers.worker import LAUNCHER_PID_ENV
from runner.environment import DistributedEnv
from runner.exit_codes import ExitCode
from runner.hardware.cuda_devices import cuda_available
from runner.hardware.host_allocator import rank_allocator
from runner.hardware.thread_wait import WAIT_POLICY, others_cores_now, wait_policy
from runner.rundir.identity import RunIdentity
from runner.train.context import RankJob

log = logging.getLogger("ladder")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 5.0  # after one rank fails, how long the others get to fail or finish on their own
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The signal the ranks get for each: they stop alike at SIGINT and SIGTERM and say which they got
# (runner/train/preemption.py), so a SIGINT stays one; SIGHUP, which they do not take, is SIGTERM.
PASSED_ON = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGTERM}
# A rank's exit codes that are no failure: it trained every step, or it stopped at a signal.
NOT_FAILED = (ExitCode.OK, ExitCode.STOPPED_RESUMABLE)


@dataclass(frozen=True)
class LaunchResult:
    """How the ranks ended: the first failing rank and its exit code, if any, and what stopped them."""

    returncode: int
    failed_rank: int | None
    stopped_by: str | None = None  # the first signal this process received, e.g. "SIGINT"
    killed: bool = False  # a second signal: the ranks were killed without waiting for their checkpoint
    pids: tuple[int, ...] = ()  # each rank's process id, by rank


class StopRequests:
    """The stop signals this process received, in order; installed only on the main thread."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signal.Signals(signum).name)

    def install(self) -> None:
        """Take over SIGINT, SIGTERM and SIGHUP until ``restore``."""
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._note)

    def restore(self) -> None:
        """Give the signals their previous handlers back."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _signal_all(procs: list[subprocess.Popen[bytes]], signum: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signum)


def _kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill the ranks still running: they wait on a rank that is gone, or were told twice to stop."""
    _signal_all(procs, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _announce(name: str) -> None:
    print(
        f"ladder: {name}: the ranks stop after this step and save a checkpoint "
        f"(train.resume=auto continues the run); {name} again kills them now",
        file=sys.stderr,
        flush=True,
    )


def _hand_job(proc: subprocess.Popen[bytes], job: bytes) -> None:
    """Write the pickled job to a rank's standard input and close it (a rank already gone reads none)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(job)
        proc.stdin.close()
    except BrokenPipeError:  # it ended before reading: _watch reports how
        pass


def launch_local(*, job: RankJob, run_dir: Path, identity: RunIdentity) -> LaunchResult:
    """Run ``job.config.gpus`` ranks on this host and wait for all of them."""
    gpus = job.config.gpus
    pickled = pickle.dumps(job)
    port = free_port()
    pythonpath = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    # A CPU rank's malloc (train.host_allocator): jemalloc keeps the pages a step frees.
    cpu_rank = not cuda_available()
    allocator = rank_allocator(job.config.train.host_allocator, cpu_rank=cpu_rank, environ=os.environ)
    # On cores other processes hold, a CPU rank's threads sleep while they wait for each other.
    waiting = wait_policy(
        cpu_rank=cpu_rank,
        environ=os.environ,
        others_cores=others_cores_now() if cpu_rank and WAIT_POLICY not in os.environ else None,
    )
    if waiting.words:
        log.info("%s", waiting.words)
    procs: list[subprocess.Popen[bytes]] = []
    stops = StopRequests()
    stops.install()  # before the first rank starts: a signal from here on is passed on to each
    try:
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
            env = {
                **os.environ,
                **allocator.env,
                **waiting.env,
                **place.exports(),
                **identity.exports(),
                "PYTHONPATH": pythonpath,
                LAUNCHER_PID_ENV: str(os.getpid()),
            }
            # `python -m` would put the user's working directory first on sys.path, where any folder
            # named like a module torch imports if present (a run directory called z3, say) shadows
            # it; the project is on PYTHONPATH, so the working directory is not needed (Python 3.11+).
            env["PYTHONSAFEPATH"] = "1"
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "launchers.worker", str(run_dir)],
                    env=env,
                    cwd=os.getcwd(),
                    stdin=subprocess.PIPE,
                )
            )
            _hand_job(procs[-1], pickled)
        return _watch(procs, stops)
    finally:
        stops.restore()
        _kill_all(procs)  # none is left after a normal end; after an error in this process, all


def _watch(procs: list[subprocess.Popen[bytes]], stops: StopRequests) -> LaunchResult:
    """Wait for the ranks: stop the rest when one fails, pass a stop signal on, kill at a second."""
    failed_rank: int | None = None
    returncode: int = ExitCode.OK
    passed_on = 0
    while any(proc.poll() is None for proc in procs):
        if len(stops.received) > passed_on:
            if passed_on == 0:
                _announce(stops.received[0])
                _signal_all(procs, PASSED_ON[stops.received[0]])
            else:
                _kill_all(procs)
                return LaunchResult(
                    returncode, failed_rank, stopped_by=stops.received[0], killed=True, pids=_pids(procs)
                )
            passed_on = len(stops.received)
        ended = [(rank, proc.poll()) for rank, proc in enumerate(procs)]
        failed = [(rank, code) for rank, code in ended if code not in (None, *NOT_FAILED)]
        # Of ranks found dead at once, one killed by a signal went first: the others' errors at
        # their next collective (gloo's "Connection closed by peer") follow from its death.
        failed.sort(key=lambda ended_rank: (ended_rank[1] or 0) >= 0)
        if failed and failed_rank is None:
            failed_rank, returncode = failed[0]
        if failed_rank is not None:
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            _kill_all(procs)
            break
        time.sleep(0.1)
    if failed_rank is None:
        for rank, proc in enumerate(procs):
            if proc.returncode not in NOT_FAILED:
                failed_rank, returncode = rank, proc.returncode
                break
    stopped_by = stops.received[0] if stops.received else None
    return LaunchResult(returncode, failed_rank, stopped_by=stopped_by, pids=_pids(procs))


def _pids(procs: list[subprocess.Popen[bytes]]) -> tuple[int, ...]:
    return tuple(proc.pid for proc in procs)
