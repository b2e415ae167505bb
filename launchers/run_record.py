"""What the launching process writes into summary.json before the ranks start, in one write: the
run, its layout and layout history, and what its plan put on each device, host and disk.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from launchers.resume import ResumeSource
from launchers.slurm.job import slurm_job_record
from runner.checkpoint.size import DiskNeed
from runner.data.tokenizer_dir import run_tokenizer_record
from runner.engine.schedule import scaled_lr
from runner.model.shape import num_params
from runner.plan.planner import Plan
from runner.rules import loss_tile_count
from runner.rundir import layout_history
from runner.rundir.identity import RunIdentity
from runner.rundir.outcome import prelaunch_status
from runner.rundir.summary import Prelaunch, run_summary, write_prelaunch
from runner.rundir.summary_records import DeviceMemoryPlan, HostMemoryRecord, StepTimeRecord
from runner.train.context import RankJob

log = logging.getLogger("ladder")


@dataclass(frozen=True)
class Planned:
    """What prelaunch chose and planned for the run (launchers/prelaunch.py, launchers/resume.py)."""

    plan: Plan
    disk: DiskNeed  # what its checkpoints need on disk
    warnings: list[str]  # what the plan warns of: the device, the host, the disk
    micro_size_choice: str | None = None  # batch.micro_size=auto: why this micro batch


def start_summary(
    job: RankJob,
    run_dir: Path,
    identity: RunIdentity,
    launcher: str,
    *,
    resume: ResumeSource,
    planned: Planned,
    experiment: str | None = None,
) -> None:
    """The prelaunch phase's summary: status running, the run's identity, layout and history,
    and its plan (what it warns of, what it puts on each device, host and disk, its step)."""
    config, layout, plan = job.config, job.layout, planned.plan
    resumed = resume.record
    this = layout_history.segment(
        from_step=resumed["completed_steps"] if resumed else 0,
        parallel=config.parallel.name,
        zero_stage=config.parallel.zero_stage,
        precision=config.precision.name.value,
        layout=layout,
        conversion=resume.conversion,
    )
    history = layout_history.extended(run_summary(run_dir).layout_history, resumed, this)
    write_prelaunch(
        run_dir,
        Prelaunch(
            outcome=prelaunch_status(),
            name=identity.name,
            group=identity.group,
            experiment=experiment,
            model=config.model.name,
            parallel=config.parallel.name,
            zero_stage=config.parallel.zero_stage,
            precision=config.precision.name.value,
            launcher=launcher,
            layout=layout.to_json(),
            num_params=num_params(config.model),
            lr=scaled_lr(config.optimizer, global_size=layout.global_size),
            slurm=slurm_job_record(os.environ),  # job id, nodes, tasks; None outside SLURM
            layout_history=history,
            tokenizer=run_tokenizer_record(config.data.tokenizer, config.data.path)
            if config.data.tokenizer
            else None,
            micro_size_choice=planned.micro_size_choice,
            plan_warnings=planned.warnings,
            host_memory=host_plan_record(plan),
            device_memory_plan=device_plan_record(plan),
            step_time=step_time_plan_record(plan),
            checkpoint_disk=planned.disk.to_json(),
        ),
    )


def host_plan_record(plan: Plan) -> HostMemoryRecord:
    """What the plan puts in one rank's host memory, for summary.json beside the run's measurement."""
    host = plan.host
    return {
        "planned_per_rank_gb": host.peak_per_rank / 1e9,
        "planned_phase": host.phase,
        "ranks_per_node": host.ranks_per_node,
    }


def device_plan_record(plan: Plan) -> DeviceMemoryPlan:
    """The peak the plan puts on each device (plan=true's total), for summary.json beside the measured,
    and the pieces the head and loss run in, which its activations rest on."""
    lay, workload = plan.layout, plan.workload
    tiles = loss_tile_count(
        workload.model, micro_size=lay.micro_size, seq_len=workload.seq_len, tp=lay.tp, pp=lay.pp
    )
    return {"planned_peak_gb": plan.memory.peak / 1e9, "fits": plan.fits, "loss_tiles": tiles}


def step_time_plan_record(plan: Plan) -> StepTimeRecord:
    """The plan's predicted step, for summary.json's ``step_time``: the run's end adds the measured
    step beside it (runner/train/attempt_end.py ``measured_step_time``), so every run checks the model."""
    time = plan.time
    return {
        "predicted_s": time.step_s,
        "predicted_is_lower_bound": not time.complete,  # a needed link bandwidth is unknown
        "terms_s": {term.name: term.seconds for term in time.terms},
        # What the plan leaves exposed of the dp, tp and pp collectives (None: a link it could not
        # price); the run's comm_exposed entry puts the measured seconds beside it.
        "comm_exposed_s": sum(term.seconds for term in time.terms if term.name.endswith(" comm"))
        if time.complete
        else None,
        "limit": time.limit,
        "bound_s": time.bound_step_s,  # the roofline: compute at peak, links at full bandwidth
        "calibration": time.calibration or None,  # None: no calibration, the prediction is the bound
    }
