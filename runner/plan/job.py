"""``plan=true``: the Hydra job that plans the configured layout, prints it and writes plan.json.

On top of the plan package: the plan of one layout (runner/plan/planner.py), its table
(runner/plan/table.py) and, with ``planner.recommend=true``, the ladder
(runner/plan/ladder.py). Nothing is launched and nothing is allocated.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from runner.config import TrainConfig
from runner.plan.checkpoint_size import disk_need
from runner.plan.ladder import recommend, recommendation_record
from runner.plan.planner import ResumePlan, plan_config
from runner.plan.table import checkpoint_disk_line, format_ladder, format_plan, resume_lines
from runner.rundir.summary import write_json_atomic

log = logging.getLogger("ladder")

PLAN_FILE = "plan.json"


def write_plan(run_dir: Path, record: dict[str, Any]) -> Path:
    """Write plan.json into the run directory (atomically) and return its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / PLAN_FILE
    write_json_atomic(path, record)
    return path


def read_plan(run_dir: Path) -> dict[str, Any]:
    """A run directory's plan.json."""
    data: dict[str, Any] = json.loads((run_dir / PLAN_FILE).read_text())
    return data


def plan_job(config: TrainConfig, *, run_dir: Path, resume: ResumePlan | None = None) -> dict[str, Any]:
    """``plan=true``: print the table (and ladder), write plan.json, launch nothing; return the record.

    ``resume``: with train.resume=auto, what the run directory holds (else None).
    """
    plan = plan_config(config)
    record = plan.record()
    text = format_plan(plan)
    disk = disk_need(config, run_dir) if resume is None else resume.disk
    record["checkpoint_disk"] = disk.record()
    if resume is not None:
        speed = plan.workload.storage_bytes_per_s
        record["resume"] = resume.record_json(speed)
        text += "\n" + "\n".join(resume_lines(resume, run_dir, speed))
    text += "\n" + checkpoint_disk_line(disk, config)
    if config.planner.recommend:
        ladder = recommend(plan.workload, overlap_comm=plan.knobs.overlap_comm)
        record["recommendation"] = recommendation_record(ladder)
        text += "\n" + format_ladder(ladder)
    print(text, flush=True)
    path = write_plan(run_dir, record)
    log.info("plan written to %s (nothing launched)", path)
    return record


__all__ = ["PLAN_FILE", "plan_job", "read_plan", "write_plan"]
