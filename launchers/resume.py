"""What a resumed run continues from, checked and converted by the launching process.

Before any rank starts: whether the run has anything left to train, whether its latest
checkpoint can be loaded on this layout (and converting it when the layout changed), and
whether its checkpoints fit on the run directory's filesystem.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launchers.hydra_files import keep_earlier_attempt, made_by_this_run
from runner.checkpoint import size as checkpoint_size
from runner.config import Resume, TrainConfig
from runner.errors import ConfigError
from runner.layout import Layout, LayoutError
from runner.metrics import goodput
from runner.plan.planner import ResumePlan, layout_for_config
from runner.rundir import checkpoint_record
from runner.rundir.disk_room import folder_bytes
from runner.rundir.metrics_file import metrics_path, truncate_metrics
from runner.rundir.run_files import CHECKPOINT_DIR
from runner.rundir.summary import RunStatus, run_summary
from runner.train.preemption import resumes

log = logging.getLogger("ladder")


def finished_already(config: TrainConfig, run_dir: Path) -> str | None:
    """Why a resumed run has nothing left to train, or None.

    A completed run (a sweep's finished cell resumed with the rest, a requeued job that had
    ended) or a checkpoint at ``train.steps`` or beyond: launching would train no step and
    rewrite the summary of the steps it did not train. Nothing is launched or written.
    """
    if not resumes(config.train):
        return None
    steps = config.train.steps
    summary = run_summary(run_dir)
    record = checkpoint_record.latest(run_dir)
    more = (
        f"a larger train.steps continues it from {record['tag']}"
        if record is not None
        else "it kept no checkpoint: a larger train.steps trains it again from step 0, "
        "keeping this attempt under earlier_attempts/"
    )
    done = summary.steps_completed or 0
    if summary.status == RunStatus.completed and done >= steps:
        return f"the run completed {done} steps already (train.steps={steps}): nothing to train; {more}"
    if record is not None and record["completed_steps"] >= steps:
        return (
            f"its checkpoint {record['tag']} holds {record['completed_steps']} steps already "
            f"(train.steps={steps}): nothing to train; {more}"
        )
    return None


NEAR_RUNS = 3  # run directories named beside a new one that holds no checkpoint


def _shown(path: Path) -> str:
    """``path`` as the user would type it: relative to the working directory when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def runs_near(run_dir: Path) -> list[Path]:
    """The run directories under ``run_dir``'s grandparent (``outputs/``: its date folders' runs,
    and a sweep's cells) that hold a complete checkpoint, the names likest ``run_dir``'s first."""
    root = run_dir.parent.parent
    held = {
        folder.parent
        for pattern in (
            f"*/*/{CHECKPOINT_DIR}",
            f"*/*/*/{CHECKPOINT_DIR}",
        )
        for folder in root.glob(pattern)
    }
    found = [run for run in held if run != run_dir and checkpoint_record.latest(run) is not None]
    name = os.path.relpath(run_dir, root)

    def likeness(run: Path) -> float:
        return difflib.SequenceMatcher(None, name, os.path.relpath(run, root)).ratio()

    return sorted(found, key=likeness, reverse=True)[:NEAR_RUNS]


def no_checkpoint_words(config: TrainConfig, run_dir: Path) -> str | None:
    """A resumed run whose directory holds no complete checkpoint: what the run says on its first
    line (``no checkpoint in DIR: starting at step 0``), naming the run directories near a new one
    that hold checkpoints. ``train.resume=required`` refuses it instead (ConfigError), before any
    rank starts. None: the run continues a checkpoint, or does not resume."""
    if not resumes(config.train) or checkpoint_record.latest(run_dir) is not None:
        return None
    near = runs_near(run_dir) if made_by_this_run(run_dir) else []
    where = _shown(run_dir)
    nearby = (
        f"; run directories near it with checkpoints: {', '.join(_shown(run) for run in near)}"
        if near
        else ""
    )
    if config.train.resume == Resume.required:
        fix = f"hydra.run.dir={_shown(near[0])}" if near else "the hydra.run.dir of the run to continue"
        raise ConfigError(
            f"  - train.resume=required: no checkpoint in {where}, nothing to resume{nearby}. "
            f"Name the run to continue ({fix}), or train.resume=auto to start at step 0 when there is none"
        )
    return f"no checkpoint in {where}: starting at step 0{nearby}"


@dataclass(frozen=True)
class ResumeSource:
    """What a run continues from: the checkpoint's record (None: from scratch), whether DeepSpeed
    loads it in the universal format (ZeRO 1-3; a stage-0 run loads a stage-0 file written from
    it), and, where this attempt converted it for its layout, the conversion's seconds and bytes."""

    record: checkpoint_record.CheckpointRecord | None = None
    universal: bool = False
    conversion: dict[str, float] | None = None


def prepare_resume(config: TrainConfig, layout: Layout, run_dir: Path, *, lead: bool) -> ResumeSource:
    """Check the checkpoint to resume from; convert it for another layout (the lead process)."""
    if not resumes(config.train):  # train.resume=auto, or a job SLURM requeued (runner/train/preemption.py)
        return ResumeSource()
    # Deferred: the checkpoint code loads torch and DeepSpeed, needed only when there is one to load.
    from runner.checkpoint import resume_rules, universal_conversion

    record = checkpoint_record.latest(run_dir)
    if record is None:
        if lead and (kept := keep_earlier_attempt(run_dir)) is not None:
            log.info("the earlier attempt's files are in %s", kept)
        return ResumeSource()
    zero_stage, precision = config.parallel.zero_stage, config.precision.name
    try:
        resume_rules.check_resumable(
            record, layout=layout, zero_stage=zero_stage, optimizer=config.optimizer.name.value
        )
    except ValueError as error:
        raise ConfigError(f"  - {error}") from None
    converts = resume_rules.needs_universal(record, layout=layout, zero_stage=zero_stage)
    conversion = None
    if lead:
        if converts:
            log.info("converting %s for the new layout", record["tag"])
            try:
                conversion = _measured(
                    run_dir / CHECKPOINT_DIR,
                    functools.partial(
                        universal_conversion.convert_for,
                        run_dir,
                        record,
                        layout=layout,
                        zero_stage=zero_stage,
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
        truncate_metrics(metrics_path(run_dir), completed_steps=record["completed_steps"])
    elif converts:
        universal_conversion.wait_for(
            run_dir,
            resume_rules.resume_tag(record, layout=layout, zero_stage=zero_stage, precision=precision),
        )
    universal = resume_rules.loads_universal(
        record, layout=layout, zero_stage=zero_stage, precision=precision
    )
    return ResumeSource(record, universal, conversion)


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


def _disk_need(
    config: TrainConfig, run_dir: Path, layout: Layout | None
) -> tuple[checkpoint_size.DiskNeed, checkpoint_record.CheckpointRecord | None]:
    """The run's checkpoints against its directory's filesystem, with what a resume finds there:
    the checkpoints it holds, the steps done and, onto another ``layout``, the converted copy
    (runner/checkpoint/size.py); and the record of the checkpoint it continues (None: none)."""
    record = checkpoint_record.latest(run_dir) if resumes(config.train) else None
    conversion = None
    if record is not None and layout is not None:
        # Deferred: the checkpoint code loads torch and DeepSpeed, needed only when there is one to load.
        from runner.checkpoint import universal_conversion

        conversion = universal_conversion.conversion(
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
        on_disk=len(checkpoint_record.complete_checkpoints(run_dir / CHECKPOINT_DIR)),
        conversion=conversion,
    )
    return need, record


def checkpoint_space(
    config: TrainConfig, run_dir: Path, layout: Layout
) -> tuple[checkpoint_size.DiskNeed, str | None]:
    """Refuse a run whose checkpoints cannot fit on its directory's filesystem; else the need,
    and the warning for one that saves only at a stop and could not then
    (runner/checkpoint/size.py)."""
    need, _ = _disk_need(config, run_dir, layout)
    if (problem := checkpoint_size.disk_problem(need, config)) is not None:
        raise ConfigError(f"  - {problem}")
    return need, checkpoint_size.stop_save_warning(need, config)


def resume_plan(config: TrainConfig, run_dir: Path) -> ResumePlan | None:
    """plan=true with train.resume=auto: what the run would continue from and do with it first,
    by the checks the run makes before its ranks start (None: the run does not resume)."""
    if not resumes(config.train):
        return None
    refusal = None
    try:
        layout: Layout | None = layout_for_config(config).layout
    except LayoutError as error:  # the run stops here; no move is weighed
        layout, refusal = None, str(error).strip().removeprefix("- ")
    need, record = _disk_need(config, run_dir, layout)
    if record is None:
        return ResumePlan(need)
    # Deferred: the checkpoint code loads torch and DeepSpeed, needed only when there is one to load.
    from runner.checkpoint import resume_rules

    if layout is not None:
        try:
            resume_rules.check_resumable(
                record,
                layout=layout,
                zero_stage=config.parallel.zero_stage,
                optimizer=config.optimizer.name.value,
            )
        except ValueError as error:
            refusal = str(error)
    saved = folder_bytes(run_dir / CHECKPOINT_DIR / record["tag"])
    return ResumePlan(need, record, saved_bytes=saved, refusal=refusal)
