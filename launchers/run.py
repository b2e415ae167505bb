"""The launching process: validate, resolve the layout, prepare the run directory, start ranks.

Everything that can refuse a run does so here, before any rank starts and before the
runner writes a file. Then either the local launcher starts the ranks, or (under
torchrun, the deepspeed launcher or srun) this process is itself one rank.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from launchers.local import launch_local
from launchers.plan_job import plan_job
from launchers.prelaunch import (
    deepspeed_config_for,
    launch_plan,
    memory_warnings,
    refuse_beyond_this_hosts_ram,
)
from launchers.rank_exit import first_words, interruption_words, kill_evidence, rank_exit_words
from launchers.resume import (
    checkpoint_space,
    finished_already,
    no_checkpoint_words,
    prepare_resume,
    resume_plan,
)
from launchers.run_record import Planned, start_summary
from runner.config import DataName, TrainConfig
from runner.data.token_file import token_source_words
from runner.diagnose import oom_killer
from runner.environment import DistributedEnv, from_environment
from runner.errors import ConfigError
from runner.exit_codes import ExitCode
from runner.hardware import calibration_seconds
from runner.layout import Layout
from runner.metrics.wall_clock import BeforeRanks, process_start
from runner.plan.planner import Plan, layout_for_config
from runner.preflight.build_locks import clear_stale_build_locks
from runner.preflight.validate import named_device_problems, validate
from runner.rundir import disk_room
from runner.rundir.identity import RunIdentity
from runner.rundir.outcome import record_failed, record_rank_cause, record_rank_failure
from runner.rundir.plan_record import PlanRecord
from runner.rundir.run_files import SUMMARY_FILE, read_failures, with_notes, write_deepspeed_config
from runner.rundir.summary import RunStatus, RunSummary, parse_summary, run_summary
from runner.train.context import RankJob
from runner.train.preemption import Preempted

log = logging.getLogger("ladder")


class RunFailed(RuntimeError):
    """A rank failed; the message names it and its error."""


class RunInterrupted(RuntimeError):
    """The ranks stopped at a signal (Ctrl-C, SIGTERM); the message says what was saved."""


class NothingToTrain(Exception):
    """A resumed run has trained its ``train.steps`` already; ``summary`` is the run's, as it was."""

    def __init__(self, words: str, summary: RunSummary) -> None:
        super().__init__(words)
        self.summary = summary


def _run_local(job: RankJob, run_dir: Path, identity: RunIdentity) -> RunSummary:
    config = job.config
    oom_counts = oom_killer.read_counts()  # the kernel's, before the ranks start
    result = launch_local(job=job, run_dir=run_dir, identity=identity)
    if result.failed_rank is None and run_summary(run_dir).status == RunStatus.completed:
        return run_summary(run_dir)  # every step done: a stop signal came during the last one
    if result.stopped_by is not None or (
        result.failed_rank is None and run_summary(run_dir).status == RunStatus.interrupted
    ):
        raise RunInterrupted(interruption_words(run_dir, result.stopped_by, killed=result.killed))
    if result.failed_rank is None:
        return run_summary(run_dir)
    failures = read_failures(run_dir)
    warned = run_summary(run_dir).plan_warnings or []
    evidence = kill_evidence(result, oom_counts, config, run_dir)
    words = rank_exit_words(result.returncode, plan_warnings=warned, **evidence)
    # ladder's own exit (launchers/worker.py): its record could not be written (its output says why)
    if result.returncode == ExitCode.FAILED:
        words += " (it could not record why; its output above says)"
    rank, cause = (result.failed_rank, words)
    recorded = run_summary(run_dir)
    if failures and result.returncode < 0:  # the others' errors followed from the killed rank's death
        cause += f"; then rank {failures[0]['rank']} failed: {first_words(str(failures[0]['error']))}"
    elif failures:
        rank, cause = failures[0]["rank"], str(failures[0]["error"])
    elif recorded.status == RunStatus.failed and recorded.error:
        # No failure record (a full disk): rank 0's summary, written over its old bytes, says why.
        rank, cause = 0, recorded.error
    try:
        record_failed(run_dir, error=cause, failed_rank=rank)
    except OSError as error:
        if not disk_room.out_of_room(error):
            raise
        cause += f"; summary.json could not be updated: {disk_room.no_room_words(error, run_dir)}"
    raise RunFailed(f"rank {rank} failed: {cause} (run directory {run_dir})")


def _run_external(job: RankJob, run_dir: Path, identity: RunIdentity, env: DistributedEnv) -> RunSummary:
    # Deferred: torch and DeepSpeed load only in a process that is itself a rank.
    from runner.train.rank import run_rank

    try:
        written = run_rank(job, run_dir=run_dir, env=env, identity=identity)  # rank 0's; {} on the others
        return parse_summary(written, run_dir / SUMMARY_FILE) if written else RunSummary()
    except Preempted:
        raise  # stopped at a signal after a checkpoint: not a failure (runner/train/preemption.py)
    except BaseException as error:
        # The failing rank records it, whichever it is: its launcher (torchrun, srun
        # --kill-on-bad-exit) stops the others, rank 0 included, before they could.
        words = disk_room.no_room_words(error, run_dir) if disk_room.out_of_room(error) else with_notes(error)
        try:
            record_rank_failure(run_dir, rank=env.rank, error=error)
        except OSError as unwritten:  # a full disk fails the records as it failed the run
            _unrecorded(unwritten, env.rank, run_dir)
        try:
            record_rank_cause(run_dir, rank=env.rank, words=words)
        except OSError as unwritten:
            _unrecorded(unwritten, env.rank, run_dir)
        raise


def _unrecorded(error: OSError, rank: int, run_dir: Path) -> None:
    """A failure record that found no room is said on stderr; any other write error is raised."""
    if not disk_room.out_of_room(error):
        raise error
    log.error("rank %d could not record its failure: %s", rank, disk_room.no_room_words(error, run_dir))


def _plan_warnings(plan: Plan, disk_warning: str | None) -> list[str]:
    """What the plan warns of (the device, the host, the disk), said in the log; summary.json
    records them (launchers/run_record.py)."""
    warnings = memory_warnings(plan)
    for warning in warnings:
        log.warning("plan: %s", warning)
    if disk_warning is not None:
        log.warning("disk: %s", disk_warning)
        warnings.append(disk_warning)
    return warnings


def _say_before_ranks(config: TrainConfig, layout: Layout) -> None:
    """The lead process's last words before the ranks start: build locks cleared, the data, the layout."""
    for line in clear_stale_build_locks():
        log.warning("%s", line)
    if config.data.path is not None and config.data.name == DataName.text:
        log.info("data.path: %s", token_source_words(config.data.path, config.data.dtype))
    log.info("layout: %s", layout.split_words())


def _check_world_size(config: TrainConfig, env: DistributedEnv | None) -> None:
    """Under torchrun or srun, ``gpus`` must be the number of ranks the launcher started."""
    if env is not None and env.world_size != config.gpus:
        raise ConfigError(
            f"  - gpus={config.gpus} but the {env.source} launcher started {env.world_size} ranks; "
            f"set gpus={env.world_size} (or start {config.gpus} ranks)"
        )


def _choose_accelerator() -> None:
    """Name DeepSpeed's accelerator before planning, resuming or a rank imports DeepSpeed.

    Imported with DS_ACCELERATOR unset on a host without CUDA, DeepSpeed logs ``Setting accelerator
    to CPU. If you have GPU or other accelerator, we were unable to detect it`` (deepspeed/accelerator/
    real_accelerator.py ``get_accelerator``), once in every process that imports it. Choosing it as
    the ranks do (runner/hardware/cuda_devices.py ``select_accelerator``) leaves it unsaid; no warning
    of anyone else's is filtered. On a host without a GPU driver it imports no torch: a run's ranks
    import it themselves, and a plan does without.
    """
    # Deferred: the probe loads only once the command is past its refusals of the command line.
    from runner.hardware.cuda_devices import select_accelerator

    select_accelerator()


# The jobs this process has begun: a sweep on this host runs its cells one after another here.
_jobs_begun: list[float] = []


def _job_start() -> tuple[float, float]:
    """When this job began, and the calibration seconds this process had spent before it.

    The first job of a process began with the process (its interpreter and imports are that job's);
    a later cell of a sweep on this host began when its own ``run`` was entered, so that its wall
    time and calibration are its own, not the sum of the cells before it.
    """
    started = process_start() if not _jobs_begun else time.time()
    _jobs_begun.append(started)
    return started, calibration_seconds.spent()


def run(
    config: TrainConfig,
    *,
    run_dir: Path,
    identity: RunIdentity,
    experiment: str | None = None,
    given: list[str] | None = None,
) -> PlanRecord | RunSummary:
    """Validate, then train (or plan) one Hydra job; returns the plan (``plan=true`` and the
    planner's other modes) or the run's summary (empty on a rank other than 0).

    ``experiment`` is the conf/experiment/ option the config was composed with, if any (Hydra's
    choice: the composed config holds its values, not its name); summary.json records it.
    ``given``: the command line's overrides (a plan's recommended command carries them).
    """
    started, calibrated_before = _job_start()
    env = from_environment(os.environ)
    launcher = "local" if env is None else env.source
    planning = config.planning
    validate(config, launcher=None if planning else launcher)
    _choose_accelerator()  # after the refusals, which answer before torch is imported
    if planning:
        # a recommended command says where it runs when this host has none of the cluster's devices
        elsewhere = config.planner.recommend and bool(named_device_problems(config))
        return plan_job(
            config, run_dir=run_dir, resume=resume_plan(config, run_dir), given=given, elsewhere=elsewhere
        )
    if (finished := finished_already(config, run_dir)) is not None:
        raise NothingToTrain(finished, run_summary(run_dir))
    lead = env is None or env.rank == 0
    starting_over = no_checkpoint_words(config, run_dir)  # train.resume=required refuses here
    if starting_over is not None and lead:
        log.warning("%s", starting_over)
    choice = layout_for_config(config)
    layout = choice.layout
    _check_world_size(config, env)
    plan = launch_plan(config, layout) if lead else None
    if env is None and plan is not None:
        refuse_beyond_this_hosts_ram(plan)
    disk, disk_warning = checkpoint_space(config, run_dir, layout)  # every rank: each refuses alike
    resume = prepare_resume(config, layout, run_dir, lead=lead)
    ds_config = deepspeed_config_for(config, layout, load_universal=resume.universal)
    before = BeforeRanks(started=started, calibration_s=calibration_seconds.spent() - calibrated_before)
    job = RankJob(config=config, layout=layout, ds_config=ds_config, before=before)
    if plan is not None:  # the lead process: rank 0, or the local launcher
        # Nobody but the owner (and its group) may write into a run: drop "other" write bits.
        run_dir.chmod(run_dir.stat().st_mode & ~0o002)
        write_deepspeed_config(run_dir, ds_config)
        if choice.reason is not None:
            log.info("batch.micro_size=auto: %s", choice.reason)
        warnings = _plan_warnings(plan, disk_warning)
        planned = Planned(plan=plan, disk=disk, warnings=warnings, micro_size_choice=choice.reason)
        start_summary(job, run_dir, identity, launcher, resume=resume, planned=planned, experiment=experiment)
        _say_before_ranks(config, layout)
    summary = (
        _run_local(job, run_dir, identity) if env is None else _run_external(job, run_dir, identity, env)
    )
    if lead and config.logger.progress:
        _print_run_end(run_dir)
    return summary


def _print_run_end(run_dir: Path) -> None:
    """The run's speed and memory tables on the console; a run that trained never fails here."""
    # Deferred: the report's tables load only where they are printed (start-up time).
    from runner.report.run_end import print_run_end

    try:
        print_run_end(run_dir)
    except Exception as error:  # the run's files are written; only the printout is lost
        log.warning(
            "could not print the run's tables (%s: %s); ladder report %s shows them",
            type(error).__name__,
            error,
            run_dir,
        )
