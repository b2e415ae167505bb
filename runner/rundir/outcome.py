"""A run's outcome: the one place its status in summary.json (a ``RunStatus``) is decided
(runner/rundir/summary.py ``write_outcome`` writes it, and the prelaunch and attempt-end records
carry it).

running       prelaunch (launchers/run_record.py) until the attempt ends
completed     every step done (rank 0, at the attempt's end)
interrupted   stopped at a signal; train.resume=auto continues (rank 0, or the launcher when the
              ranks left no record: launchers/run.py)
failed        a rank raised, was killed, or its job never ran (the failing rank, the launcher,
              launchers/slurm/watch.py)

The first failure recorded is the cause: a later one (a peer that lost the failed rank) does not
replace it. Each failing rank's own record is failure_rank<N>.json (``record_rank_failure``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.rundir.run_files import write_failure
from runner.rundir.summary import Outcome, RunStatus, run_summary, write_outcome


def attempt_status(status: RunStatus, error: str | None = None) -> Outcome:
    """An attempt's end as runner/train/attempt_end.py writes it: the status and its words."""
    return Outcome(status=status, error=error)


def prelaunch_status() -> Outcome:
    """What prelaunch records (launchers/run_record.py): running, no error yet."""
    return Outcome(status=RunStatus.running)


def recorded_status(run_dir: Path) -> RunStatus | None:
    """The status summary.json records now (None without one)."""
    return run_summary(run_dir).status


def failure_recorded(run_dir: Path) -> bool:
    """Whether summary.json names a failure already (another rank's, recorded first)."""
    return recorded_status(run_dir) == RunStatus.failed


def record_failed(run_dir: Path, *, error: str, failed_rank: int | None = None) -> dict[str, Any]:
    """Mark the run failed with ``error`` (and the rank that caused it, when known)."""
    return write_outcome(run_dir, Outcome(status=RunStatus.failed, error=error, failed_rank=failed_rank))


def record_failed_if_running(run_dir: Path, *, error: str) -> None:
    """Mark a run failed that its ranks left ``running`` (killed, or never started): a job
    scheduler's verdict does not replace one the ranks recorded."""
    if (recorded_status(run_dir) or RunStatus.running) == RunStatus.running:
        run_dir.mkdir(parents=True, exist_ok=True)
        record_failed(run_dir, error=error)


def record_rank_failure(run_dir: Path, *, rank: int, error: BaseException, trace: str | None = None) -> None:
    """A failing rank's own record, failure_rank<N>.json (its error and traceback)."""
    write_failure(run_dir, rank=rank, error=error, trace=trace)


def record_rank_cause(run_dir: Path, *, rank: int, words: str) -> None:
    """The failing rank's cause in summary.json, unless another rank recorded its own first;
    rank 0's end record (no ``failed_rank``) lacks the error's notes, so it is replaced."""
    recorded = run_summary(run_dir)
    own = rank == 0 and recorded.failed_rank is None
    if recorded.status != RunStatus.failed or own:
        record_failed(run_dir, error=words, failed_rank=rank)


def record_interrupted(run_dir: Path, *, words: str) -> None:
    """Mark the run interrupted at a signal, with what a resume continues from."""
    write_outcome(run_dir, Outcome(status=RunStatus.interrupted, error=words))
