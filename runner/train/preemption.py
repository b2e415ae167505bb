"""Stopping at a signal: a checkpoint at the end of the step, then SLURM's job goes back to the queue.

A local run stops the same way: Ctrl-C sends SIGINT to the terminal's process group,
ranks included, and the local launcher passes SIGINT, SIGTERM or SIGHUP on to the ranks as
SIGTERM (launchers/local.py). Its ranks exit ``ExitCode.STOPPED_RESUMABLE`` (75) after the
checkpoint, and ``train.resume=auto`` continues the run.

SLURM signals every task of a job before it ends it: SIGUSR2 ``signal_delay_s`` before
the time limit (``sbatch --signal=USR2@N``, which submitit writes) or on request
(``scancel --signal=USR2 JOB``); SIGTERM when it preempts, requeues (``scontrol
requeue``) or cancels the job, and SIGKILL ``KillWait`` seconds later. A handler can
run between any two bytecodes, in the middle of a collective, so it only notes the
signal (``StopSignals``). The training loop polls once per step; the ranks agree on
the note (an all-reduce, MAX, in runner/train/rank.py), save a checkpoint together after the
same step, and leave by raising ``Preempted``.

SIGUSR2 asks for a requeue. Under submitit, the handler replaced here is submitit's
(submitit/core/job_environment.py ``SignalHandler.checkpoint_and_try_requeue``): rank 0
chains to it after the save (``StopSignals.hand_back``). It calls the launcher's
``checkpoint()`` (the same cell again), runs ``scontrol requeue`` and counts time
limits against ``max_num_timeout``; preemptions are not counted. After SIGTERM SLURM
itself requeues the job or ends it. Every rank then exits with ``ExitCode.STOPPED_RESUMABLE``
without a result, so the launching process keeps waiting for the requeued job.

The requeued job runs the same cell again in the same run directory; SLURM exports
``SLURM_RESTART_COUNT`` > 0 to it, and ``resumes`` makes it load the latest checkpoint
as ``train.resume=auto`` would (so do runs started with ``LADDER_RESUME`` set).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from runner.config import Resume, TrainLoopConfig
from runner.exit_codes import ExitCode

RESUME_ENV = "LADDER_RESUME"  # set by a resumed (requeued) job that must re-enter its directory
RESTART_ENV = "SLURM_RESTART_COUNT"  # sbatch(1): times SLURM restarted the job (requeue, node failure)

NONE, TERM, REQUEUE = 0, 1, 2  # what was asked, in increasing order: the ranks agree on the MAX
# SIGINT is Ctrl-C in the terminal of a local run, which reaches every rank of its process group.
_ASKS = {signal.SIGTERM: TERM, signal.SIGINT: TERM, signal.SIGUSR2: REQUEUE}
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def restarts(environ: Mapping[str, str]) -> int:
    """How many times SLURM restarted this job (0 outside SLURM or on the first run)."""
    try:
        return int(environ.get(RESTART_ENV, "0"))
    except ValueError:
        return 0


def requeued(environ: Mapping[str, str]) -> bool:
    """Whether this run is a requeued (or explicitly resumed) job that must re-enter its directory."""
    return restarts(environ) > 0 or bool(environ.get(RESUME_ENV))


def resumes(train: TrainLoopConfig, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the run loads its directory's latest checkpoint: train.resume=auto or required, or a
    requeued job."""
    return train.resume != Resume.never or requeued(os.environ if environ is None else environ)


class Preempted(BaseException):
    """This rank stopped at a signal after a checkpoint.

    Not an ``Exception``: Hydra's ``run_job`` and submitit's ``process_job`` record
    exceptions as the job's failed result, and an interrupted job has no result yet.
    """

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record["reason"])
        self.record = record


class StopSignals:
    """SIGUSR2, SIGTERM and SIGINT noted, not acted on: the training loop reads ``asked`` once per step."""

    def __init__(self) -> None:
        self.asked = NONE
        self.name = ""  # the signal behind ``asked`` as this rank received it, e.g. "SIGINT"
        self._previous: dict[int, _Handler] = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        ask = _ASKS.get(signal.Signals(signum), NONE)
        if ask > self.asked:
            self.asked, self.name = ask, signal.Signals(signum).name

    def install(self) -> bool:
        """Take over SIGUSR2, SIGTERM and SIGINT, keeping the handlers they had; False off the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in _ASKS:
            self._previous[signum] = signal.signal(signum, self._note)
        return True

    def restore(self) -> None:
        """Give the signals their previous handlers back."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def hand_back(self) -> tuple[bool, str]:
        """After the checkpoint, on rank 0: let submitit's SIGUSR2 handler requeue the job.

        Returns whether the job was requeued and what happened. Outside submitit nothing
        requeues here: a batch script can on ``ExitCode.STOPPED_RESUMABLE``.
        """
        previous = self._previous.get(signal.SIGUSR2)
        if not callable(previous):
            return False, f"not requeued: no submitit handler; the ranks exit {ExitCode.STOPPED_RESUMABLE}"
        try:
            previous(signal.SIGUSR2, None)
        except SystemExit:  # submitit requeued the job and asks the task to leave
            return True, "requeued by submitit (scontrol requeue)"
        except subprocess.CalledProcessError as error:
            if error.returncode == -signal.SIGTERM and "requeue" in error.cmd:
                # The requeue took: slurmctld ends the job's processes at once ("CANCELLED
                # DUE TO JOB REQUEUE"), and scontrol, a child of this rank, is one of them.
                return True, "requeued by submitit (scontrol requeue, ended by SLURM as it requeued the job)"
            return False, f"not requeued: {str(error).strip()}"
        except Exception as error:  # e.g. UncompletedJobError: timed out more than max_num_timeout
            return False, f"not requeued: {str(error).strip() or type(error).__name__}"
        return False, "not requeued: submitit's handler returned without requeuing"
