"""One rank's life: join the group, set up, train, record, leave cleanly.

Every rank runs this, whoever started it (the local launcher, torchrun, the deepspeed
launcher or srun). Rank 0 also owns the metric sinks and writes ``summary.json``. The
parts, in the order they run:

- runner/train/trainer.py  the trainer: built from runner/train/setup.py's parts (model, engine
  with DeepSpeed's faults fixed, resume, sinks), then the steps;
- runner/train/attempt_end.py   summary.json, however the attempt ended.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from runner.diagnose import oom_killer, out_of_memory, peer_loss
from runner.engine.distributed import init_distributed, teardown
from runner.environment import DistributedEnv
from runner.hardware.cuda_devices import select_accelerator
from runner.hardware.mfu_peak import above_calibrated_peak
from runner.metrics.wall_clock import WallClock
from runner.rundir.disk_room import no_room_words, out_of_room
from runner.rundir.identity import RunIdentity
from runner.rundir.outcome import attempt_status, failure_recorded
from runner.rundir.summary import Outcome, RunStatus, run_summary
from runner.train.attempt_end import record_end, recorded_unless_out_of_room
from runner.train.context import RankJob, RunContext
from runner.train.preemption import Preempted, StopSignals
from runner.train.trainer import Trainer

log = logging.getLogger("ladder")


def _failed(error: BaseException, run_dir: Path) -> Outcome:
    """The status of an attempt that ``error`` ended, in words (a full disk says where)."""
    words = no_room_words(error, run_dir) if out_of_room(error) else f"{type(error).__name__}: {error}"
    return attempt_status(RunStatus.failed, words)


def _attempt(ctx: RunContext, until_return: contextlib.ExitStack) -> dict[str, Any]:
    """Set up, train and record this rank's attempt; rank 0's summary (empty on other ranks)."""
    # Where this attempt's time goes, from the command's start.
    wall = WallClock(process_group_s=ctx.process_group_s, before=ctx.job.before)
    wall.mark("launch")
    trainer = Trainer(ctx, wall, until_return)
    status: Outcome | None = attempt_status(RunStatus.failed, "interrupted")
    interruption: dict[str, Any] | None = None
    try:
        trainer.train()
        status = attempt_status(RunStatus.completed)
        mfu = trainer.progress.last.get("throughput/mfu")
        if ctx.lead and (overrun := above_calibrated_peak(trainer.peak, mfu, ctx.config.precision.name)):
            log.warning("%s", overrun)
    except Preempted as stopped:
        status = attempt_status(RunStatus.interrupted, stopped.record["reason"])
        interruption = stopped.record
        raise
    except BaseException as error:
        status = _failed(error, ctx.run_dir)
        raise
    finally:
        summary: dict[str, Any] = {}
        if status is not None and status.status == RunStatus.failed and failure_recorded(ctx.run_dir):
            status = None  # another rank failed first and recorded why: keep its cause
        if ctx.lead:
            with recorded_unless_out_of_room(status, ctx.run_dir):
                interruptions = None
                if interruption is not None:  # each stop at a signal, across requeues
                    interruptions = [*(run_summary(ctx.run_dir).interruptions or []), interruption]
                summary = record_end(trainer, status, interruptions=interruptions)
        for sink in trainer.sinks:
            sink.close(summary)
    return summary


def run_rank(job: RankJob, *, run_dir: Path, env: DistributedEnv, identity: RunIdentity) -> dict[str, Any]:
    """Train on this rank and return rank 0's summary (empty on other ranks)."""
    # A SLURM task stops at SIGUSR2 / SIGTERM after a checkpoint (runner/train/preemption.py), and so
    # does a rank of the local launcher at SIGINT (Ctrl-C) or SIGTERM (the launcher's, passed on).
    stop = StopSignals()
    watching = env.source in ("slurm", "local", "torchrun") and stop.install()
    oom_counts = oom_killer.read_counts()  # the kernel's, as this rank starts (runner/diagnose/peer_loss.py)
    accelerator = select_accelerator()
    device, process_group_s = init_distributed(env, accelerator=accelerator)
    ctx = RunContext(
        job=job,
        run_dir=run_dir,
        env=env,
        identity=identity,
        device=device,
        accelerator=accelerator,
        process_group_s=process_group_s,
        stop=stop if watching else None,
    )
    ok = False
    try:
        with contextlib.ExitStack() as until_return:
            summary = _attempt(ctx, until_return)
        ok = True
        return summary
    except Preempted:
        ok = True  # every rank saved and stopped after the same step: leave together
        raise
    except BaseException as error:
        out_of_memory.explain(error, job.config, run_dir)  # where it ran out, and the plan's terms
        peer_loss.explain(error, oom_counts, run_dir)  # another rank's process (or its node) ended first
        raise
    finally:
        teardown(ok=ok)
        if ok:
            stop.restore()
        # A failed rank keeps only noting SIGTERM and SIGINT until it exits: torchrun (or srun)
        # sends SIGTERM to the other ranks as soon as one fails, and this rank's caller has yet
        # to write its failure record and summary (launchers/run.py, launchers/worker.py).
