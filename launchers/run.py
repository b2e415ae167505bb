"""The launching process: validate, resolve the layout, prepare the run directory, start ranks.

Everything that can refuse a run does so here, before any rank starts and before the
runner writes a file. Then either the local launcher starts the ranks, or (under
torchrun, the deepspeed launcher or srun) this process is itself one rank.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.hydra_files import keep_earlier_attempt
from launchers.local import LaunchResult, launch_local
from launchers.slurm_job import slurm_job_record
from runner.config import DataName, TrainConfig
from runner.data.token_file import token_source_words
from runner.diagnose import disk_room, oom_killer, out_of_memory
from runner.engine.deepspeed_config import build_deepspeed_config
from runner.engine.schedule import scaled_lr
from runner.environment import DistributedEnv, from_environment
from runner.errors import ConfigError
from runner.layout import Layout, LayoutError, parse_micro_size, resolve_layout
from runner.metrics import goodput
from runner.metrics.wall_clock import folder_bytes
from runner.model.shape import num_params
from runner.plan import checkpoint_size
from runner.plan.job import plan_job
from runner.plan.planner import (
    Plan,
    ResumePlan,
    gb,
    knobs_from_config,
    micro_fit_for_config,
    plan_layout,
    workload_from_config,
)
from runner.preflight.build_locks import clear_stale_build_locks
from runner.preflight.validate import validate
from runner.rundir import checkpoint_record, layout_history
from runner.rundir.identity import RunIdentity
from runner.rundir.run_files import read_failures, with_notes, write_deepspeed_config, write_failure
from runner.rundir.summary import read_summary, update_summary
from runner.train.context import RankJob
from runner.train.preemption import Preempted, resumes

log = logging.getLogger("ladder")


class RunFailed(RuntimeError):
    """A rank failed; the message names it and its error."""


class RunInterrupted(RuntimeError):
    """The ranks stopped at a signal (Ctrl-C, SIGTERM); the message says what was saved."""


class NothingToTrain(Exception):
    """A resumed run has trained its ``train.steps`` already; ``summary`` is the run's, as it was."""

    def __init__(self, words: str, summary: dict[str, Any]) -> None:
        super().__init__(words)
        self.summary = summary


def finished_already(config: TrainConfig, run_dir: Path) -> str | None:
    """Why a resumed run has nothing left to train, or None.

    A completed run (a sweep's finished cell resumed with the rest, a requeued job that had
    ended) or a checkpoint at ``train.steps`` or beyond: launching would train no step and
    rewrite the summary of the steps it did not train. Nothing is launched or written.
    """
    if not resumes(config):
        return None
    steps = config.train.steps
    summary = read_summary(run_dir)
    record = checkpoint_record.latest(run_dir)
    more = (
        f"a larger train.steps continues it from {record['tag']}"
        if record is not None
        else "it kept no checkpoint: a larger train.steps trains it again from step 0, "
        "keeping this attempt under earlier_attempts/"
    )
    done = summary.get("steps_completed") or 0
    if summary.get("status") == "completed" and done >= steps:
        return f"the run completed {done} steps already (train.steps={steps}): nothing to train; {more}"
    if record is not None and record["completed_steps"] >= steps:
        return (
            f"its checkpoint {record['tag']} holds {record['completed_steps']} steps already "
            f"(train.steps={steps}): nothing to train; {more}"
        )
    return None


def choose_layout_explained(config: TrainConfig) -> tuple[Layout, str | None]:
    """The layout, and for ``micro_size=auto`` why that micro-batch (planned bytes vs device memory)."""
    micro_size = parse_micro_size(config.batch.micro_size)
    fit = micro_fit_for_config(config) if micro_size is None else None
    try:
        layout = resolve_layout(
            gpus=config.gpus,
            tp=config.parallel.tp,
            pp=config.parallel.pp,
            global_size=config.batch.global_size,
            micro_size=micro_size,
            fits=fit,
        )
    except LayoutError as error:
        if fit is not None and fit.none_fit:
            raise LayoutError(fit.refusal()) from error
        raise
    return layout, None if fit is None else fit.reason(layout.micro_size)


def choose_layout(config: TrainConfig) -> Layout:
    """The batch contract applied to this config (``micro_size=auto`` picks the largest that fits)."""
    return choose_layout_explained(config)[0]


def deepspeed_config_for(
    config: TrainConfig, layout: Layout, *, load_universal: bool = False
) -> dict[str, Any]:
    """DeepSpeed's config for this run, with the learning rate scaled to its global batch."""
    return build_deepspeed_config(
        layout=layout,
        model=config.model,
        parallel=config.parallel,
        precision=config.precision,
        optimizer=config.optimizer,
        lr=scaled_lr(config.optimizer, global_size=layout.global_size),
        load_universal=load_universal,
    )


@dataclass(frozen=True)
class Resume:
    """What a run continues from: the checkpoint's record (None: from scratch), whether DeepSpeed
    loads it in the universal format (ZeRO 1-3; a stage-0 run loads a stage-0 file written from
    it), and, where this attempt converted it for its layout, the conversion's seconds and bytes."""

    record: dict[str, Any] | None = None
    universal: bool = False
    conversion: dict[str, float] | None = None


def _prepare_resume(config: TrainConfig, layout: Layout, run_dir: Path, *, lead: bool) -> Resume:
    """Check the checkpoint to resume from; convert it for another layout (the lead process)."""
    if not resumes(config):  # train.resume=auto, or a job SLURM requeued (runner/train/preemption.py)
        return Resume()
    from runner.checkpoint import store as checkpoint

    record = checkpoint.latest(run_dir)
    if record is None:
        if lead and (kept := keep_earlier_attempt(run_dir)) is not None:
            log.info("no checkpoint to continue from: starting over; the earlier attempt is in %s", kept)
        return Resume()
    stage, precision = config.parallel.zero_stage, config.precision.name
    try:
        checkpoint.check_resumable(
            record, layout=layout, zero_stage=stage, optimizer=config.optimizer.name.value
        )
    except ValueError as error:
        raise ConfigError(f"  - {error}") from None
    converts = checkpoint.needs_universal(record, layout=layout, zero_stage=stage)
    conversion = None
    if lead:
        if converts:
            log.info("converting %s for the new layout", record["tag"])
            try:
                conversion = _measured(
                    run_dir / checkpoint_record.CHECKPOINT_DIR,
                    functools.partial(
                        checkpoint.convert_for,
                        run_dir,
                        record,
                        layout=layout,
                        zero_stage=stage,
                        model=config.model,
                        precision=precision,
                    ),
                )
            except ValueError as error:  # the conversion failed: nothing of the run was changed
                raise ConfigError(f"  - {error}") from None
            if conversion is not None:  # None: an earlier attempt had converted it for this layout
                seconds, size = conversion["seconds"], conversion["bytes"]
                log.info("converted %s in %.1f s (%.1f MB written)", record["tag"], seconds, size / 1e6)
                goodput.record_conversion(run_dir, seconds=seconds, size=int(size), tag=record["tag"])
        checkpoint.truncate_metrics(run_dir / "metrics.jsonl", completed_steps=record["completed_steps"])
    elif converts:
        checkpoint.wait_for(
            run_dir, checkpoint.resume_tag(record, layout=layout, zero_stage=stage, precision=precision)
        )
    universal = checkpoint.loads_universal(record, layout=layout, zero_stage=stage, precision=precision)
    return Resume(record, universal, conversion)


def _measured(root: Path, convert: Callable[[], object]) -> dict[str, float] | None:
    """Run a conversion that writes its folders under ``root``: its seconds and the bytes of the
    folders it wrote (None when it wrote none: done already)."""
    there = {entry.name for entry in root.iterdir()}
    started = time.perf_counter()
    convert()
    seconds = time.perf_counter() - started
    written = [entry for entry in root.iterdir() if entry.name not in there and entry.is_dir()]
    if not written:
        return None
    return {"seconds": seconds, "bytes": sum(folder_bytes(folder) for folder in written)}


def _start_summary(
    config: TrainConfig,
    layout: Layout,
    run_dir: Path,
    identity: RunIdentity,
    launcher: str,
    *,
    resume: Resume,
    experiment: str | None = None,
) -> None:
    resumed = resume.record
    this = layout_history.segment(
        from_step=resumed["completed_steps"] if resumed else 0,
        parallel=config.parallel.name,
        zero_stage=config.parallel.zero_stage,
        precision=config.precision.name.value,
        layout=layout,
        conversion=resume.conversion,
    )
    history = layout_history.extended(read_summary(run_dir).get("layout_history"), resumed, this)
    update_summary(
        run_dir,
        status="running",
        error=None,
        name=identity.name,
        group=identity.group,
        experiment=experiment,
        model=config.model.name,
        parallel=config.parallel.name,
        zero_stage=config.parallel.zero_stage,
        precision=config.precision.name.value,
        launcher=launcher,
        layout=layout.record(),
        num_params=num_params(config.model),
        lr=scaled_lr(config.optimizer, global_size=layout.global_size),
        slurm=slurm_job_record(os.environ),  # job id, nodes, tasks; None outside SLURM
        layout_history=history,
    )


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


def _interruption_words(run_dir: Path, stopped_by: str | None, *, killed: bool) -> str:
    """What a stopped local run says: the ranks' own record, or, if they left none, what was kept.

    Rank 0 records a stop after its checkpoint (status "interrupted"); ranks killed by a
    second signal, or stopped before training began, leave the summary as it was: it is
    marked interrupted here, with the newest checkpoint a resume would load.
    """
    summary = read_summary(run_dir)
    if summary.get("status") == "interrupted":  # rank 0 wrote it after the checkpoint
        return str(summary.get("error"))
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
    update_summary(run_dir, status="interrupted", error=words)
    return words


def _first_words(error: str, limit: int = 200) -> str:
    """An error's first line, cut at ``limit`` characters."""
    line = error.strip().splitlines()[0] if error.strip() else error
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _kill_evidence(
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


def _run_local(job: RankJob, run_dir: Path, identity: RunIdentity) -> dict[str, Any]:
    config = job.config
    oom_counts = oom_killer.read_counts()  # the kernel's, before the ranks start
    result = launch_local(job=job, run_dir=run_dir, identity=identity)
    if result.failed_rank is None and read_summary(run_dir).get("status") == "completed":
        return read_summary(run_dir)  # every step done: a stop signal came during the last one
    if result.stopped_by is not None or (
        result.failed_rank is None and read_summary(run_dir).get("status") == "interrupted"
    ):
        raise RunInterrupted(_interruption_words(run_dir, result.stopped_by, killed=result.killed))
    if result.failed_rank is None:
        return read_summary(run_dir)
    failures = read_failures(run_dir)
    warned = read_summary(run_dir).get("plan_warnings") or []
    evidence = _kill_evidence(result, oom_counts, config, run_dir)
    words = rank_exit_words(result.returncode, plan_warnings=warned, **evidence)
    if result.returncode == 1:  # ladder's own exit: its record could not be written (its output says why)
        words += " (it could not record why; its output above says)"
    rank, cause = (result.failed_rank, words)
    recorded = read_summary(run_dir)
    if failures and result.returncode < 0:  # the others' errors followed from the killed rank's death
        cause += f"; then rank {failures[0]['rank']} failed: {_first_words(str(failures[0]['error']))}"
    elif failures:
        rank, cause = failures[0]["rank"], str(failures[0]["error"])
    elif recorded.get("status") == "failed" and recorded.get("error"):
        # No failure record (a full disk): rank 0's summary, written over its old bytes, says why.
        rank, cause = 0, str(recorded["error"])
    try:
        update_summary(run_dir, status="failed", failed_rank=rank, error=cause)
    except OSError as error:
        if not disk_room.out_of_room(error):
            raise
        cause += f"; summary.json could not be updated: {disk_room.no_room_words(error, run_dir)}"
    raise RunFailed(f"rank {rank} failed: {cause} (run directory {run_dir})")


def _run_external(job: RankJob, run_dir: Path, identity: RunIdentity, env: DistributedEnv) -> dict[str, Any]:
    # Deferred: torch and DeepSpeed load only in a process that is itself a rank.
    from runner.train.rank import run_rank

    try:
        return run_rank(job, run_dir=run_dir, env=env, identity=identity)
    except Preempted:
        raise  # stopped at a signal after a checkpoint: not a failure (runner/train/preemption.py)
    except BaseException as error:
        # The failing rank records it, whichever it is: its launcher (torchrun, srun
        # --kill-on-bad-exit) stops the others, rank 0 included, before they could.
        words = disk_room.no_room_words(error, run_dir) if disk_room.out_of_room(error) else with_notes(error)
        try:
            write_failure(run_dir, rank=env.rank, error=error)
        except OSError as unwritten:  # a full disk fails the records as it failed the run
            _unrecorded(unwritten, env.rank, run_dir)
        try:
            recorded = read_summary(run_dir)
            # Rank 0's own record (it names no failed_rank) lacks the error's notes; any other stays.
            own = env.rank == 0 and recorded.get("failed_rank") is None
            if recorded.get("status") != "failed" or own:
                update_summary(run_dir, status="failed", failed_rank=env.rank, error=words)
        except OSError as unwritten:
            _unrecorded(unwritten, env.rank, run_dir)
        raise


def _unrecorded(error: OSError, rank: int, run_dir: Path) -> None:
    """A failure record that found no room is said on stderr; any other write error is raised."""
    if not disk_room.out_of_room(error):
        raise error
    log.error("rank %d could not record its failure: %s", rank, disk_room.no_room_words(error, run_dir))


def launch_plan(config: TrainConfig) -> Plan:
    """The plan of this run's own layout, without the peak (a CPU measurement the run makes itself)."""
    return plan_layout(workload_from_config(config, with_peak=False), knobs_from_config(config))


def host_plan_record(plan: Plan) -> dict[str, Any]:
    """What the plan puts in one rank's host memory, for summary.json beside the run's measurement."""
    host = plan.host
    return {
        "planned_per_rank_gb": host.peak_per_rank / 1e9,
        "planned_phase": host.phase,
        "ranks_per_node": host.ranks_per_node,
    }


def device_plan_record(plan: Plan) -> dict[str, Any]:
    """The peak the plan puts on each device (plan=true's total), for summary.json beside the measured."""
    return {"planned_peak_gb": plan.memory.peak / 1e9, "fits": plan.fits}


def memory_warnings(plan: Plan) -> list[str]:
    """What the plan of this run says will not fit, device or host, with the numbers (empty: it fits).

    A warning, not a refusal: the device and host figures may be datasheet numbers, and the
    estimate is an upper bound in places (DESIGN.md: the planner proposes, the run measures).
    """
    warnings = []
    if not plan.fits:
        usable = plan.workload.usable_bytes
        warnings.append(
            f"the plan puts {gb(plan.memory.peak)} on each device, more than its {gb(usable)} usable: "
            "it will likely run out of device memory (plan=true shows the terms; "
            "planner.recommend=true the cheapest layout that fits)"
        )
    if not plan.host.fits:
        warnings.append(f"host memory per node: {plan.host.verdict()}")
    return warnings


def refuse_beyond_this_hosts_ram(plan: Plan) -> None:
    """Refuse a local launch whose host memory the plan puts beyond all of this host's RAM.

    Past the headroom the plan only warns (memory_warnings); past the RAM itself the kernel's
    out-of-memory killer would end a rank, or first some other program of the user's. The
    host plan is within a few percent of the measured RSS on a CPU, and at or above it on one
    H200 (CUDA's host side measured there; docs/benchmarks.md).
    """
    host = plan.host
    if host.peak_per_node <= host.ram_bytes:
        return
    fixes = "; ".join(fix for fix in host.fixes if not fix.startswith(("more nodes", "a larger host")))
    raise ConfigError(
        f"  - this host has {gb(host.ram_bytes)} of RAM [{host.ram_source}] and the plan needs "
        f"{gb(host.peak_per_node)} of it ({host.verdict()}): the out-of-memory killer would end a "
        f"rank, or another program first. planner.recommend=true finds the cheapest layout that "
        f"fits, plan=true shows every term{'; or ' + fixes if fixes else ''}"
    )


def _disk_need(
    config: TrainConfig, run_dir: Path, layout: Layout | None
) -> tuple[checkpoint_size.DiskNeed, dict[str, Any] | None]:
    """The run's checkpoints against its directory's filesystem, with what a resume finds there:
    the checkpoints it holds, the steps done and, onto another ``layout``, the converted copy
    (runner/plan/checkpoint_size.py); and the record of the checkpoint it continues (None: none)."""
    record = checkpoint_record.latest(run_dir) if resumes(config) else None
    conversion = None
    if record is not None and layout is not None:
        from runner.checkpoint import store as checkpoint

        conversion = checkpoint.conversion(
            run_dir,
            record,
            layout=layout,
            zero_stage=config.parallel.zero_stage,
            model=config.model,
            precision=config.precision.name,
            optimizer=config.optimizer.name.value,
        )
    need = checkpoint_size.disk_need(
        config,
        run_dir,
        done_steps=record["completed_steps"] if record else 0,
        on_disk=len(checkpoint_record.complete_checkpoints(run_dir / checkpoint_record.CHECKPOINT_DIR)),
        conversion=conversion,
    )
    return need, record


def checkpoint_space(
    config: TrainConfig, run_dir: Path, layout: Layout
) -> tuple[checkpoint_size.DiskNeed, str | None]:
    """Refuse a run whose checkpoints cannot fit on its directory's filesystem; else the need,
    and the warning for one that saves only at a stop and could not then
    (runner/plan/checkpoint_size.py)."""
    need, _ = _disk_need(config, run_dir, layout)
    if (problem := checkpoint_size.disk_problem(need, config)) is not None:
        raise ConfigError(f"  - {problem}")
    return need, checkpoint_size.stop_save_warning(need, config)


def resume_plan(config: TrainConfig, run_dir: Path) -> ResumePlan | None:
    """plan=true with train.resume=auto: what the run would continue from and do with it first,
    by the checks the run makes before its ranks start (None: the run does not resume)."""
    if not resumes(config):
        return None
    refusal = None
    try:
        layout: Layout | None = choose_layout(config)
    except LayoutError as error:  # the run stops here; no move is weighed
        layout, refusal = None, str(error).strip().removeprefix("- ")
    need, record = _disk_need(config, run_dir, layout)
    if record is None:
        return ResumePlan(need)
    from runner.checkpoint import store as checkpoint

    if layout is not None:
        try:
            checkpoint.check_resumable(
                record,
                layout=layout,
                zero_stage=config.parallel.zero_stage,
                optimizer=config.optimizer.name.value,
            )
        except ValueError as error:
            refusal = str(error)
    saved = folder_bytes(run_dir / checkpoint_record.CHECKPOINT_DIR / record["tag"])
    return ResumePlan(need, record, saved_bytes=saved, refusal=refusal)


def local_launch_problems(config: TrainConfig) -> list[str]:
    """What ``run`` would refuse before starting this config's ranks on this host, one line each.

    A local sweep checks every cell with it before the first one trains
    (launchers/local_sweep.py). A run directory's own refusals (a resume onto another
    global batch) are not here: they depend on what the cell's directory holds then.
    """
    planning = config.plan or config.planner.recommend
    try:
        validate(config, launcher=None if planning else "local")
        if not planning:
            choose_layout_explained(config)
            refuse_beyond_this_hosts_ram(launch_plan(config))
    except (ConfigError, LayoutError) as error:
        return [line.strip().removeprefix("- ") for line in str(error).splitlines() if line.strip()]
    return []


def run(
    config: TrainConfig, *, run_dir: Path, identity: RunIdentity, experiment: str | None = None
) -> dict[str, Any]:
    """Validate, then train (or plan) one Hydra job; returns the run's summary.

    ``experiment`` is the conf/experiment/ option the config was composed with, if any (Hydra's
    choice: the composed config holds its values, not its name); summary.json records it.
    """
    env = from_environment(os.environ)
    launcher = "local" if env is None else env.source
    planning = config.plan or config.planner.recommend  # recommend implies plan
    validate(config, launcher=None if planning else launcher)
    if planning:
        return plan_job(config, run_dir=run_dir, resume=resume_plan(config, run_dir))
    if (finished := finished_already(config, run_dir)) is not None:
        raise NothingToTrain(finished, read_summary(run_dir))
    layout, micro_choice = choose_layout_explained(config)
    if env is not None and env.world_size != config.gpus:
        raise ConfigError(
            f"  - gpus={config.gpus} but the {env.source} launcher started {env.world_size} ranks; "
            f"set gpus={env.world_size} (or start {config.gpus} ranks)"
        )
    lead = env is None or env.rank == 0
    plan = launch_plan(config) if lead else None
    if env is None and plan is not None:
        refuse_beyond_this_hosts_ram(plan)
    disk, disk_warning = checkpoint_space(config, run_dir, layout)  # every rank: each refuses alike
    resume = _prepare_resume(config, layout, run_dir, lead=lead)
    ds_config = deepspeed_config_for(config, layout, load_universal=resume.universal)
    if lead:
        # Nobody but the owner (and its group) may write into a run: drop "other" write bits.
        run_dir.chmod(run_dir.stat().st_mode & ~0o002)
        write_deepspeed_config(run_dir, ds_config)
        _start_summary(config, layout, run_dir, identity, launcher, resume=resume, experiment=experiment)
        if micro_choice is not None:
            update_summary(run_dir, micro_size_choice=micro_choice)
            log.info("batch.micro_size=auto: %s", micro_choice)
        assert plan is not None
        warnings = memory_warnings(plan)
        for warning in warnings:
            log.warning("plan: %s", warning)
        if disk_warning is not None:
            log.warning("disk: %s", disk_warning)
            warnings.append(disk_warning)
        update_summary(
            run_dir,
            plan_warnings=warnings,
            host_memory=host_plan_record(plan),
            device_memory_plan=device_plan_record(plan),
            checkpoint_disk=disk.record(),
        )
        for line in clear_stale_build_locks():
            log.warning("%s", line)
        if config.data.path is not None and config.data.name == DataName.text:
            log.info("data.path: %s", token_source_words(config.data.path, config.data.dtype))
        log.info(
            "layout: gpus %d = dp %d x tp %d x pp %d; global %d = micro %d x accum %d x dp %d",
            layout.gpus,
            layout.dp,
            layout.tp,
            layout.pp,
            layout.global_size,
            layout.micro_size,
            layout.accum_steps,
            layout.dp,
        )
    job = RankJob(config=config, layout=layout, ds_config=ds_config)
    if env is None:
        summary = _run_local(job, run_dir, identity)
    else:
        summary = _run_external(job, run_dir, identity, env)
    if lead and config.logger.progress:
        _print_run_end(run_dir)
    return summary


def _print_run_end(run_dir: Path) -> None:
    """The run's speed and memory tables on the console; a run that trained never fails here."""
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
