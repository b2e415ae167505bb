"""``plan=true``: the Hydra job that plans the configured layout, prints it and writes plan.json.

On top of the plan package: the plan of one layout (runner/plan/planner.py), its table
(runner/report/plan_table.py) and, with ``planner.recommend=true``, the ladder
(runner/plan/ladder.py). Nothing is launched and nothing is allocated.

The plan's verdict is its exit status (:func:`plan_exit_code`, docs/memory-and-plan.md), and
plan.json's ``exit_code``: a script can tell a layout that fits from one that does not.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from runner.checkpoint.size import DiskNeed, disk_need, disk_problem
from runner.config import TrainConfig
from runner.exit_codes import ExitCode
from runner.plan.ladder import Ladder, recommend, recommendation_record
from runner.plan.max_seq import longest_sequences, max_seq_lines
from runner.plan.planner import Plan, ResumePlan, plan_config
from runner.report.plan_table import checkpoint_disk_line, format_ladder, format_plan, resume_lines
from runner.rundir.plan_record import PlanRecord, write_plan

log = logging.getLogger("ladder")


def plan_exit_code(plan: Plan, disk_refused: bool, ladder: Ladder | None = None) -> ExitCode:
    """The plan's verdict as an exit status: 3 when the layout does not fit (device memory, host
    memory, or checkpoints that a run would be refused for on a filesystem the plan can see:
    ``disk_refused``), else 4 when it holds the batch contract only at another global batch,
    else 0. With ``planner.recommend=true`` the ladder's verdict instead: 0 when a layout fits
    (its command is printed), 4 when no rung could hold the batch contract, else 3."""
    if ladder is not None:
        if ladder.winner is not None:
            return ExitCode.OK
        if all(rung.plan.contract_error is not None for rung in ladder.rungs):
            return ExitCode.PLAN_CONTRACT_NOT_MET
        return ExitCode.PLAN_DOES_NOT_FIT
    if not (plan.fits and plan.host.fits) or disk_refused:
        return ExitCode.PLAN_DOES_NOT_FIT
    return ExitCode.PLAN_CONTRACT_NOT_MET if plan.contract_error is not None else ExitCode.OK


def unseen_filesystem_line(need: DiskNeed, config: TrainConfig) -> str:
    """The checkpoints of a plan for a named cluster whose filesystem this host cannot see."""
    every = config.train.checkpoint_every
    one = "one checkpoint after the last step" if config.train.save_final else "one checkpoint at a stop"
    saves = one if not every else f"{need.needed / 1e9:.3f} GB of checkpoints"
    return (
        f"  train.checkpoint_every={every}: {saves}; the filesystem of cluster={config.cluster.name} is not "
        f"seen from here: set cluster.storage_path=<a directory on it> to weigh its free space"
    )


def where_it_runs(command: str, cluster: str) -> str:
    """Where a recommended command for a named GPU cluster runs, said on a host without its devices
    (the local launcher here refuses it): on the cluster's hosts, or submitted from here."""
    submitted = command.replace("python train.py ", "python train.py -m hydra/launcher=slurm ", 1)
    return (
        f"  this host has no device of cluster {cluster}: run it on one of the cluster's hosts, or submit "
        f"it from here to SLURM:\n  {submitted}"
    )


def _plan_disk(config: TrainConfig, run_dir: Path, resume: ResumePlan | None) -> tuple[DiskNeed, bool]:
    """The checkpoints against the filesystem the run will write to, and whether it was seen.

    A resume weighs its own run directory; a named cluster, cluster.storage_path (this host's
    disk is not the cluster's), else nothing; cluster=local, the run directory's filesystem.
    """
    if resume is not None:
        return resume.disk, True
    if config.cluster.storage_path is not None:
        return disk_need(config, Path(config.cluster.storage_path)), True
    return disk_need(config, run_dir), config.cluster.name == "local"


def plan_job(
    config: TrainConfig,
    *,
    run_dir: Path,
    resume: ResumePlan | None = None,
    given: list[str] | None = None,
    elsewhere: bool = False,
) -> PlanRecord:
    """``plan=true``: print the table (and ladder), write plan.json, launch nothing; return the record,
    whose ``exit_code`` is the plan's verdict (:func:`plan_exit_code`).

    ``resume``: with train.resume=auto, what the run directory holds (else None). ``given``: the
    command line's overrides, which the recommended command carries. ``elsewhere``: this host has
    none of the named cluster's devices, so the recommended command says where it runs.
    """
    plan = plan_config(config)
    record = plan.record()
    text = format_plan(plan)
    disk, seen = _plan_disk(config, run_dir, resume)
    checkpoint_disk = disk.to_json()
    if resume is not None:
        speed = plan.workload.storage_bytes_per_s
        record = replace(record, resume=resume.record_json(speed))
        text += "\n" + "\n".join(resume_lines(resume, run_dir, speed))
    if seen:
        text += "\n" + checkpoint_disk_line(disk, config)
    else:
        checkpoint_disk.update(free_bytes=None, filesystem_of=None, fits=None)
        text += "\n" + unseen_filesystem_line(disk, config)
    record = replace(record, checkpoint_disk=checkpoint_disk)
    if config.planner.max_seq:
        longest = longest_sequences(plan.workload, plan.knobs, plan.layout)
        record = replace(record, max_seq=longest)
        text += "\n" + "\n".join(max_seq_lines(plan.workload, plan.knobs, plan.layout, longest))
    ladder = None
    if config.planner.recommend:
        ladder = recommend(plan.workload, overlap_comm=config.parallel.overlap_comm, given=given)
        record = replace(record, recommendation=recommendation_record(ladder))
        text += "\n" + format_ladder(ladder)
        if elsewhere and ladder.command:
            text += "\n" + where_it_runs(ladder.command, config.cluster.name)
    # The disk as a run weighs it: periodic checkpoints or a move's copy that cannot fit refuse the
    # run; the one checkpoint a stop writes is a warning (runner/checkpoint/size.py).
    refused = seen and disk_problem(disk, config) is not None
    record = replace(record, exit_code=plan_exit_code(plan, refused, ladder))
    print(text, flush=True)
    path = write_plan(run_dir, record)
    log.info("plan written to %s (nothing launched)", path)
    return record


__all__ = [
    "plan_exit_code",
    "plan_job",
]
