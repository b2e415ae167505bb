"""Wait for a sweep's jobs: cancel one that SLURM will never start, explain one that failed.

A pending job carries a reason (squeue %r). Most mean "wait" (Priority, Resources);
some mean the request itself can never be met while it stands, and the job would pend
forever on a cluster without ``EnforcePartLimits`` (https://slurm.schedmd.com/
job_reason_codes.html: BadConstraints, Partition*Limit, the per-job QOSMax* / AssocMax*
limits, an invalid account or QOS).
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from launchers.slurm.submission import Cell
from runner.rundir.outcome import record_failed_if_running
from runner.rundir.summary import RunStatus, run_summary

log = logging.getLogger("ladder.slurm")
POLL_S = 1.0  # result files are checked this often (submitit's Job.wait does the same)
SQUEUE_EVERY_S = 15.0  # pending reasons are read this often


class SlurmJobFailed(RuntimeError):
    """A cell's SLURM job failed or was cancelled; the message has its id and its log's tail."""


_NEVER = frozenset(
    {
        "BadConstraints",
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "InvalidAccount",
        "InvalidQOS",
        "AccountNotAllowed",
        "QOSNotAllowed",
    }
)


def never_starts(reason: str) -> bool:
    """Whether a pending reason means the job as submitted can never start."""
    if reason in _NEVER:
        return True
    # Per-job maxima of a QOS or association (QOSMaxNodePerJobLimit, AssocMaxGRESPerJob, ...);
    # per-user counts like QOSMaxJobsPerUserLimit clear when other jobs end.
    return reason.startswith(("QOSMax", "AssocMax")) and "PerJob" in reason


def _squeue(job_id: str) -> str:
    try:
        done = subprocess.run(
            ["squeue", "-h", "-r", "-j", job_id, "-o", "%i|%T|%r"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def stuck_jobs(job_ids: Iterable[str]) -> dict[str, str]:
    """Pending jobs (``123`` or array elements ``123_4``) that will never start, with their reason."""
    wanted = set(job_ids)
    stuck: dict[str, str] = {}
    for array_id in sorted({job_id.split("_")[0] for job_id in wanted}):
        for line in _squeue(array_id).splitlines():
            job_id, state, reason = [*line.split("|"), "", ""][:3]
            if job_id in wanted and state == "PENDING" and never_starts(reason):
                stuck[job_id] = reason
    return stuck


def cancel(job_ids: Iterable[str]) -> None:
    """scancel these jobs (array elements included); errors are ignored."""
    ids = sorted(set(job_ids))
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)


def log_tail(path: Path, lines: int = 25) -> str:
    """The last lines of a task's log file, or a note that there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def wait(jobs: dict[int, Any]) -> dict[int, str]:
    """Wait for every job; cancel those that can never start, returning their reasons."""
    waiting = dict(jobs)
    never: dict[int, str] = {}
    last_check = time.monotonic()
    while waiting:
        for num, job in list(waiting.items()):
            if job.done():
                del waiting[num]
        if waiting and time.monotonic() - last_check >= SQUEUE_EVERY_S:
            last_check = time.monotonic()
            stuck = stuck_jobs(job.job_id for job in waiting.values())
            for num, job in list(waiting.items()):
                if job.job_id in stuck:
                    never[num] = stuck[job.job_id]
                    del waiting[num]
            cancel(stuck)
        if waiting:
            time.sleep(POLL_S)
    return never


def _failed(cell: Cell, message: str) -> JobReturn:
    """A failed cell's JobReturn; its summary says failed even when rank 0 was killed mid-run."""

    record_failed_if_running(cell.run_dir, error=message.splitlines()[0])
    ret = JobReturn(overrides=cell.overrides, status=JobStatus.FAILED)
    ret.return_value = SlurmJobFailed(f"cell {cell.label}: {message}")
    return ret


def _reason(error: Exception) -> str:
    """The line that says why: a task's exception (submitit passes its traceback as text)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exited)\b", line)]
    return (raised or lines or [type(error).__name__])[-1]


def _recorded_error(cell: Cell) -> str | None:
    """The error the failing rank wrote to the cell's summary.json, in its own words (an out of
    memory one with where and the plan's terms, runner/diagnose/out_of_memory.py), or None."""

    recorded = run_summary(cell.run_dir)
    error = recorded.error if recorded.status == RunStatus.failed else None
    return error or None


def _telling_log(cell: Cell, job_id: str) -> Path:
    """The log of the first task that says why it failed (the failing rank), else task 0's."""
    # Deferred: submitit is needed only by a SLURM sweep.
    from submitit.core.utils import JobPaths

    tasks = cell.placement.nodes * cell.placement.tasks_per_node
    kind = "stdout" if cell.params.get("stderr_to_stdout") else "stderr"
    paths = [Path(getattr(JobPaths(cell.folder, job_id=job_id, task_id=t), kind)) for t in range(tasks)]
    for path in paths:
        text = log_tail(path, lines=200)
        if "ladder:" in text or "Traceback" in text:
            return path
    return paths[0]


def _rank0_result(job: Any) -> JobReturn:
    """Rank 0's JobReturn (every task returns one), or the error of a task that failed.

    Tasks whose result file is there are read first: a task that raised answers at once,
    where submitit would first wait 15 s (``Job._results_timeout_s``, for a slow shared
    filesystem) for the file of a task that SLURM killed and that will never write one.
    """
    tasks = [job.task(i) for i in range(job.num_tasks)] if job.num_tasks > 1 else [job]
    for task in tasks:
        if Path(task.paths.result_pickle).exists():
            task.result()  # raises the task's own error
    result: JobReturn = tasks[0].result()
    return result


def collect(cells: list[Cell], jobs: dict[int, Any], never: dict[int, str]) -> list[JobReturn]:
    """One JobReturn per cell, in sweep order; a failed job's carries its log's tail."""
    returns: list[JobReturn] = []
    for cell in cells:
        job = jobs[cell.num]
        if cell.num in never:
            reason = never[cell.num]
            returns.append(
                _failed(
                    cell,
                    f"SLURM job {job.job_id} would never start (pending reason {reason}, "
                    f"https://slurm.schedmd.com/job_reason_codes.html); it was cancelled",
                )
            )
            continue
        try:
            result = _rank0_result(job)
        except Exception as error:
            path = _telling_log(cell, job.job_id)
            state = job.state  # submitit's last look, often older than the result file
            ended = f" ({state})" if state not in ("RUNNING", "PENDING", "COMPLETING", "UNKNOWN") else ""
            message = f"SLURM job {job.job_id} failed{ended}: {_recorded_error(cell) or _reason(error)}"
            if state == "OUT_OF_MEMORY":
                message += (
                    "; SLURM's memory cap (--mem, --mem-per-gpu) ended it: raise the cap, or plan=true "
                    "shows the host memory a node needs"
                )
            log.error("%s: %s", cell.label, message)
            returns.append(_failed(cell, f"{message}\nlast lines of {path}:\n{log_tail(path)}"))
            continue
        log.info("%s: SLURM job %s %s", cell.label, job.job_id, result.status.name.lower())
        returns.append(result)
    return returns
