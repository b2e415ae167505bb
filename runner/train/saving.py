"""Checkpoints the loop takes: every ``train.checkpoint_every`` steps, after the last step
(``train.save_final``), and at a stop signal.

A save at a stop is followed by every rank raising :class:`Preempted` with what was saved
(runner/train/preemption.py has the signals and what SLURM does next).
"""

from __future__ import annotations

import logging
import os
import time

from runner.checkpoint import save as checkpoint
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.metrics.wall_clock import WallClock
from runner.rundir import checkpoint_record
from runner.rundir.disk_room import folder_bytes
from runner.rundir.run_files import CHECKPOINT_DIR
from runner.train.context import RunContext
from runner.train.preemption import REQUEUE, Preempted, StopSignals, restarts

log = logging.getLogger("ladder")

# torchrun and the deepspeed launcher send SIGKILL this long after their SIGTERM
# (torch.distributed.elastic's PContext.close, deepspeed/launcher/launch.py's wait_procs).
LAUNCHER_KILL_AFTER_S = 30.0


def slow_save_warning(save_s: float, *, source: str, warned: bool) -> None:
    """Once: a save that takes over half the grace torchrun gives ranks after its SIGTERM."""
    if source == "torchrun" and not warned and save_s > LAUNCHER_KILL_AFTER_S / 2:
        log.warning(
            "a checkpoint took %.0f s; torchrun (or the deepspeed launcher) kills its ranks %.0f s after "
            "its SIGTERM, so a save at a stop may be cut off (the one before stays the latest); ladder's "
            "own launcher (python train.py gpus=N) waits for it",
            save_s,
            LAUNCHER_KILL_AFTER_S,
        )


def save(
    ctx: RunContext,
    wall: WallClock,
    engine: DeepSpeedEngine,
    record: checkpoint.SaveRecord,
    *,
    expected_bytes: int,
) -> None:
    """Save the checkpoint ``record`` describes, timed into the run's wall clock; ``expected_bytes``:
    its planned size, to check what the save wrote."""
    config = ctx.config
    saving = time.perf_counter()
    checkpoint.save(
        engine,
        ctx.run_dir,
        record,
        rank=ctx.rank,
        keep=config.train.keep_checkpoints,
        expected_bytes=expected_bytes,
    )
    tag = checkpoint_record.tag_for(record.completed_steps)
    written = ctx.run_dir / CHECKPOINT_DIR / tag
    wall.checkpoint(time.perf_counter() - saving, folder_bytes(written) if ctx.lead else 0)
    if ctx.lead:
        log.info("%s", wall.last_save(tag))
        slow_save_warning(wall.last_save_s, source=ctx.env.source, warned=wall.checkpoints > 1)


def stopped(ctx: RunContext, completed: int, asked: int, stop: StopSignals) -> Preempted:
    """What every rank raises once the ranks agreed to stop and saved ``completed`` steps.

    The signal is named as this rank received it (Ctrl-C's SIGINT, the launcher's SIGTERM),
    or by what the ranks agreed on where this rank received none.
    """
    source = ctx.env.source
    name = stop.name if stop.asked == asked else ("SIGUSR2" if asked == REQUEUE else "SIGTERM")
    requeued: bool | None = None
    outcome = (
        "SLURM requeues or ends the job itself"
        if source == "slurm"
        else "train.resume=auto in this run directory continues it"
    )
    if asked == REQUEUE and source == "slurm":
        requeued, outcome = stop.hand_back() if ctx.lead else (None, "rank 0 hands the job back")
    tag = checkpoint_record.tag_for(completed)
    return Preempted(
        {
            "signal": name,
            "completed_steps": completed,
            "checkpoint": tag,
            "requeued": requeued,
            "slurm_restart": restarts(os.environ),
            "reason": f"stopped by {name} after {completed} steps with checkpoint {tag}; {outcome}",
        }
    )
