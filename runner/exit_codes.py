"""The exit codes of ladder's commands and of each rank, one enum for every ``sys.exit``.

``python train.py``, ``ladder`` and each rank a launcher starts exit with one of these; the
launchers read a rank's back (launchers/local.py, launchers/run.py, launchers/slurm/task.py).
Two codes come from conventions outside ladder: 75 is sysexits.h's EX_TEMPFAIL ("temporary
failure; the user is invited to retry"), and 130 is the shell's 128 + SIGINT for a command
that Ctrl-C ended. docs/running.md lists them for a user.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a command or a rank says by its exit status."""

    # The command did what it was asked: a run completed, each plan of plan=true fits and holds
    # the batch contract, --help was answered, a `ladder` subcommand finished; a rank trained
    # every step; a SLURM task that ended with its result (launchers/slurm/task.py).
    OK = 0
    # A run failed: train.py after a rank failed (launchers/run.py RunFailed), or after a sweep
    # on this host whose cells failed (named above it); a rank that raised, after writing its
    # failure_rank<N>.json (launchers/worker.py: the launcher reads 1 without that record as a
    # rank that could not write it); a SLURM task whose collective lost a peer, left without a
    # result so that SLURM may requeue its job; the checkpoint conversion of `ladder export`,
    # run in its own process, that refused (its words on stderr). Python exits 1 at an
    # uncaught exception too.
    FAILED = 1
    # Refused before anything ran: a key, a value, a layout or a run directory train.py will not
    # launch, a sweep whose cells differ, a `ladder` subcommand's bad input (argparse exits 2 at
    # a usage error as well), a rank started without RANK and WORLD_SIZE. Nothing trained; the
    # message names the fix.
    REFUSED = 2
    # plan=true: the layout does not fit (device memory, host memory, or the checkpoints a run
    # would be refused for); planner.recommend=true: no layout of any rung fits. A sweep of plans
    # exits with it when any cell does not fit (launchers/plan_exit.py).
    PLAN_DOES_NOT_FIT = 3
    # plan=true: it fits, but holds the batch contract only at another global batch;
    # planner.recommend=true: no rung holds the configured global batch.
    PLAN_CONTRACT_NOT_MET = 4
    # sysexits.h EX_TEMPFAIL. A rank or a run stopped by a signal (Ctrl-C, SIGTERM, SIGUSR2)
    # at the end of a step, after a checkpoint (runner/train/preemption.py), or before it had
    # anything to save. Each rank returns it (launchers/worker.py, launchers/slurm/task.py),
    # and so does train.py for the run they made (launchers/run.py RunInterrupted). It is no
    # failure: the local launcher waits for the other ranks as at a normal end, a requeued
    # SLURM job runs the cell again in its run directory, slurm.conf's RequeueExit can requeue
    # a batch job on it, and train.resume=auto continues the run from its checkpoint.
    STOPPED_RESUMABLE = 75
    # The shell's 128 + SIGINT. Ctrl-C ended the command itself, with no rank of its own to
    # stop at a checkpoint: train.py while it validated or planned (no rank had started), or
    # while it watched a SLURM sweep (the jobs stay queued, SLURM's now), or `ladder tokenize`
    # (nothing written). There is no run to resume from it: run the command again.
    CTRL_C_AT_COMMAND = 130

    def __str__(self) -> str:
        """The number, as IntEnum prints it from Python 3.11 on (3.10 printed the member's name)."""
        return str(self.value)
