"""Entry point of one rank started by the local launcher: ``python -m launchers.worker RUN_DIR``.

It reads what the launching process decided from its standard input (launchers/local.py
pickles the :class:`~runner.train.context.RankJob`: the typed config, its layout and
DeepSpeed's config), so every rank runs exactly that, with no config composed again.
A rank that fails leaves ``failure_rank<N>.json`` with its error for the launcher; one
stopped by a signal after its checkpoint (runner/train/preemption.py) exits 75
(``ExitCode.STOPPED_RESUMABLE``) and leaves none.
If the launching process dies, the kernel sends the rank SIGTERM (Linux's parent-death
signal), so a rank never trains on alone: it stops after its step, as at Ctrl-C.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import pickle
import signal
import sys
import traceback
from pathlib import Path

from runner.environment import from_environment
from runner.exit_codes import ExitCode
from runner.rundir.identity import RunIdentity
from runner.rundir.outcome import record_rank_failure
from runner.rundir.run_files import TRAIN_LOG
from runner.train.context import RankJob
from runner.train.preemption import Preempted

LAUNCHER_PID_ENV = "LADDER_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def tie_to_launcher(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Have the kernel send this rank SIGTERM when its launcher dies; False if it is gone already.

    prctl(2) PR_SET_PDEATHSIG; the parent is checked after the call, since a launcher that
    died before it would never signal. Elsewhere than Linux (or without the launcher's pid)
    nothing is tied and the rank runs on.
    """
    launcher = environ.get(LAUNCHER_PID_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    return os.getppid() == int(launcher)


def log_like_the_launcher(run_dir: Path, rank: int) -> None:
    """Rank 0's ``ladder`` lines (a resume, each checkpoint's size and time) go where the launching
    process's go: the console and the run's train.log, in Hydra's format (conf/config.yaml's
    job_logging). The other ranks keep warnings only; without this every INFO line was dropped."""
    formatter = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if rank == 0:
        handlers.append(logging.FileHandler(run_dir / TRAIN_LOG))  # appends, as Hydra's handler does
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    logging.getLogger("ladder").setLevel(logging.INFO if rank == 0 else logging.WARNING)


def main(argv: list[str]) -> ExitCode:
    """Run this process's rank; exit non-zero on failure."""
    run_dir = Path(argv[1])
    env = from_environment(os.environ)
    if env is None:
        print("launchers.worker needs RANK and WORLD_SIZE (it is started by the local launcher)")
        return ExitCode.REFUSED
    env = dataclasses.replace(env, source="local")  # its variables look like torchrun's
    log_like_the_launcher(run_dir, env.rank)
    if not tie_to_launcher(os.environ):
        print(f"rank {env.rank}: its launcher exited before the rank started; not starting")
        return ExitCode.STOPPED_RESUMABLE
    try:
        job = pickle.load(sys.stdin.buffer)  # from the launching process, which wrote it: trusted
        if not isinstance(job, RankJob):
            raise TypeError(f"expected a RankJob on standard input, got {type(job).__name__}")
        # Deferred: torch and DeepSpeed load after the rank is tied to its launcher (above).
        from runner.train.rank import run_rank

        run_rank(job, run_dir=run_dir, env=env, identity=RunIdentity.from_env(run_dir))
    except Preempted:  # every rank saved a checkpoint after the same step and stops: not a failure
        return ExitCode.STOPPED_RESUMABLE
    except KeyboardInterrupt:  # Ctrl-C before the rank watched for it (importing torch): nothing to save
        return ExitCode.STOPPED_RESUMABLE
    except BaseException as error:
        trace = traceback.format_exc()
        try:
            record_rank_failure(run_dir, rank=env.rank, error=error, trace=trace)
        except OSError as unwritten:  # a full disk: the record fails as the run did
            print(f"ladder: rank {env.rank} could not record its failure: {unwritten}", file=sys.stderr)
        print(trace, file=sys.stderr, end="")
        return ExitCode.FAILED
    return ExitCode.OK


def exit_now(code: ExitCode) -> None:
    """Flush and leave without interpreter teardown.

    Every file is written and the process group destroyed by then; what is left are
    destructors of gloo and DeepSpeed's communication ops, which abort now and then at
    interpreter exit ("terminate called without an active exception", SIGABRT) and would
    turn a finished rank into a failed one.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv))
