"""How the ranks of a local run ended, in words: an exit code or a signal, the kernel's
out-of-memory killer, a stop that saved no checkpoint.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

from launchers.local import LaunchResult
from launchers.prelaunch import launch_plan
from runner.config import TrainConfig
from runner.diagnose import oom_killer, out_of_memory
from runner.rundir import checkpoint_record
from runner.rundir.outcome import record_interrupted
from runner.rundir.run_files import read_failures
from runner.rundir.summary import RunStatus, run_summary

log = logging.getLogger("ladder")


def rank_exit_words(
    returncode: int,
    *,
    plan_warnings: list[str],
    killer: oom_killer.KillVerdict | None = None,
    memory: str = "",
) -> str:
    """How a rank that left no failure record ended, in words: its exit code or the signal.

    A rank killed by SIGKILL that nobody stopped was most often killed by the kernel's
    out-of-memory killer: ``killer`` (runner/diagnose/oom_killer.py) says whether it was, where the
    kernel's counts or log tell; the plan's memory warnings of the run, if any, say why, else
    ``memory`` (runner/diagnose/out_of_memory.py ``killed_words``) what the plan put on the host.
    """
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    words = f"killed by {name}"
    if -returncode != signal.SIGKILL:
        return words
    if killer is None:
        words += " (on Linux most often the out-of-memory killer; `dmesg` or the job's log says)"
    else:
        words += f" ({killer.words})"
    if plan_warnings and (killer is None or killer.by_oom_killer):
        words += "; the plan had warned: " + "; ".join(plan_warnings)
    elif memory and killer is not None and killer.by_oom_killer:
        words += "; " + memory
    return words


def interruption_words(run_dir: Path, stopped_by: str | None, *, killed: bool) -> str:
    """What a stopped local run says: the ranks' own record, or, if they left none, what was kept.

    Rank 0 records a stop after its checkpoint (status "interrupted"); ranks killed by a
    second signal, or stopped before training began, leave the summary as it was: it is
    marked interrupted here, with the newest checkpoint a resume would load.
    """
    summary = run_summary(run_dir)
    if summary.status == RunStatus.interrupted:  # rank 0 wrote it after the checkpoint
        return str(summary.error)
    latest = checkpoint_record.latest(run_dir)
    how = f"killed at a second {stopped_by}" if killed else f"stopped by {stopped_by}"
    kept = (
        f"the newest is {latest['tag']} ({latest['completed_steps']} steps), "
        "where train.resume=auto continues"
        if latest
        else "train.resume=auto starts it over, keeping this attempt's files"
    )
    failures = read_failures(run_dir)
    if failures:  # a rank failed at the stop, its checkpoint most likely (a full disk)
        words = (
            f"{how}; rank {failures[0]['rank']} failed before a checkpoint was saved: {failures[0]['error']}"
        )
        words = words if "train.resume=auto" in words else f"{words}; {kept}"
    else:
        words = f"{how} before the ranks saved a checkpoint; {kept}"
    record_interrupted(run_dir, words=words)
    return words


def first_words(error: str, limit: int = 200) -> str:
    """An error's first line, cut at ``limit`` characters."""
    line = error.strip().splitlines()[0] if error.strip() else error
    return line if len(line) <= limit else line[: limit - 3] + "..."


def kill_evidence(
    result: LaunchResult, before: oom_killer.OomCounts, config: TrainConfig, run_dir: Path
) -> dict[str, Any]:
    """For a rank that died of SIGKILL: whether the out-of-memory killer ended it, and the plan's
    host memory beside the last measured peak (``rank_exit_words``'s ``killer`` and ``memory``)."""
    if result.returncode != -signal.SIGKILL or result.failed_rank is None:
        return {}
    pid = result.pids[result.failed_rank] if result.failed_rank < len(result.pids) else None
    killer = oom_killer.killer_verdict(before, pid)
    if killer is None or not killer.by_oom_killer:
        return {"killer": killer}
    try:
        plan = launch_plan(config)
        memory = out_of_memory.killed_words(plan, out_of_memory.last_measured(run_dir))
    except Exception as unplanned:  # the words help; they must not hide the failure itself
        memory = f"the plan could not be made to say more: {unplanned}"
    return {"killer": killer, "memory": memory}
