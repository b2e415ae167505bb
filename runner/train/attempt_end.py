"""The end of one rank's attempt: rank 0 writes summary.json and closes the sinks.

Whatever ended the attempt (its last step, a stop signal, an error), summary.json records
its status, the steps completed, the final metrics, the memory ledger (estimated beside
measured), where its wall time went and its goodput across attempts.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from runner.engine.compile_blocks import compile_summary
from runner.metrics import goodput
from runner.metrics.ledger import Estimate, Ledger, host_relative_errors, relative_errors
from runner.metrics.step_spread import WARMUP_STEPS, step_time_spread
from runner.metrics.wall_clock import wall_parts
from runner.rundir.disk_room import no_room_words, out_of_room
from runner.rundir.summary import AttemptEnd, Outcome, RunStatus, RunSummary, run_summary, write_attempt_end
from runner.rundir.summary_records import CommExposedRecord, HostMemoryRecord, MemoryRecord, StepTimeRecord
from runner.train.evaluation import evaluation_summary
from runner.train.pipeline_hooks import pipeline_summary
from runner.train.trainer import Trainer

log = logging.getLogger("ladder")


def memory_summary(
    estimate: Estimate, measured: Ledger | None, *, peak_bytes: float, measured_at: str
) -> MemoryRecord:
    """The ledger as summary.json keeps it (GB = 1e9 bytes)."""

    def gb(values: dict[str, int]) -> dict[str, float]:
        return {f"{name}_gb": value / 1e9 for name, value in values.items()}

    summary: MemoryRecord = {
        "unit": "GB (1e9 bytes)",
        "estimated": {
            **gb(estimate.terms),
            "total_gb": (sum(estimate.terms.values()) + sum(estimate.residual.values())) / 1e9,
            "residual": gb(estimate.residual),
        },
        "textbook": gb(estimate.textbook),
        "offloaded_to_host": gb(estimate.host),
        "measured_at": measured_at,
    }
    if measured is not None:
        summary["measured"] = {
            **gb(measured.terms),
            "peak_gb": peak_bytes / 1e9,
            "residual": gb(measured.residual),
        }
        summary["rel_error"] = relative_errors(estimate.terms, measured.terms)
        if estimate.host:
            summary["host_rel_error"] = host_relative_errors(estimate.host, measured.terms, measured.residual)
    return summary


@contextlib.contextmanager
def recorded_unless_out_of_room(status: Outcome | None, run_dir: Path) -> Iterator[None]:
    """Rank 0's records of a run that failed for want of room may fail the same way: then the
    failure is said on stderr, and the error that ended the run is the one raised."""
    try:
        yield
    except OSError as error:
        if status is None or status.status != RunStatus.failed or not out_of_room(error):
            raise
        log.error("the run's end could not be recorded in summary.json: %s", no_room_words(error, run_dir))


def measured_step_time(
    recorded: StepTimeRecord | None, step_s: Sequence[float], *, warmup: int = WARMUP_STEPS
) -> StepTimeRecord | None:
    """summary.json's ``step_time``: the plan's prediction, recorded at launch
    (launchers/run_record.py ``step_time_plan_record``), with the attempt's measured step beside it:
    the median of its step times after the first ``warmup`` (as the report's medians leave them
    out) and the model's relative error, (predicted - measured) / measured. None: nothing to record."""
    record = recorded.copy() if isinstance(recorded, dict) else StepTimeRecord()
    kept = list(step_s[warmup:])
    if not kept:
        return record or None
    measured = statistics.median(kept)
    predicted = record.get("predicted_s")
    error = None
    if isinstance(predicted, int | float) and not isinstance(predicted, bool) and measured > 0:
        error = (predicted - measured) / measured
    record["measured_s"], record["measured_steps"], record["error"] = measured, len(kept), error
    return record


def record_end(
    trainer: Trainer, status: Outcome | None, *, interruptions: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Rank 0 writes the attempt's end into summary.json and returns it; ``status`` None: another
    rank failed first and recorded why. ``interruptions``: every stop at a signal, this one last."""
    ctx, progress, wall = trainer.ctx, trainer.progress, trainer.wall
    run_dir = ctx.run_dir
    ended = status.status if status is not None else None
    completed = (
        (progress.step + 1) if ended in (RunStatus.completed, RunStatus.interrupted) else progress.step
    )
    wall_time = wall.summary()
    if trainer.attempt is not None:
        trainer.attempt.end(
            status=ended or RunStatus.failed,
            steps_completed=completed,
            steps_s=wall.steps_s,
            parts=wall_parts(wall, wall_time),
        )
    evaluated = (
        evaluation_summary(
            ctx.config.train, ctx.config.data, progress.evaluated, global_size=ctx.layout.global_size
        )
        if trainer.held_out is not None
        else None
    )
    last, recorded = progress.last, run_summary(run_dir)
    probes = trainer.probes.summary(seq_len=ctx.config.data.seq_len)
    return write_attempt_end(
        run_dir,
        AttemptEnd(
            outcome=status,
            interruptions=interruptions,
            steps_completed=completed,
            final={**last},  # a copy typed as the schema holds it (NaN: null)
            step_time_spread=step_time_spread(list(wall.step_times)),
            step_time=measured_step_time(recorded.step_time, list(wall.step_times)),
            peak_flops_per_device=trainer.peak_flops,
            peak_flops_source=trainer.peak.source,
            peak_flops_calibration=trainer.peak.calibration_record(ranks=ctx.layout.gpus),
            peak_memory_measure=trainer.peak_memory.label,
            cuda_allocator=trainer.peak_memory.allocator_record(),
            host_memory=_host_memory(recorded, last),
            memory=memory_summary(
                trainer.estimate,
                progress.ledger,
                peak_bytes=last.get("memory/peak_gb", 0.0) * 1e9,
                measured_at=f"each term at its most over ranks, step {progress.ledger_step} accumulation "
                "boundary (before the optimizer step)",
            ),
            accelerator=ctx.accelerator,
            model_build={"rank": 0, **trainer.model_build},
            compile=compile_summary(trainer.compiled_blocks) if trainer.compiled_blocks else None,
            noise_scale=probes["noise_scale"],
            comm_exposed=_comm_exposed(probes["comm_exposed"], recorded),
            pipeline=pipeline_summary(
                trainer.pipeline.engine,
                ctx.layout,
                step_s=last.get("time/step_s"),
                p2p_s=last.get("time/p2p_s"),
            )
            if trainer.pipeline is not None
            else None,
            skipped_steps=trainer.nonfinite.summary(),
            fp16_loss_scale=trainer.overflows.summary(),
            resumed_from_step=trainer.resumed.start_step or None,
            profile=trainer.profiler.summary(run_dir),
            wall_time=wall_time,
            eval=evaluated,
            goodput=goodput.account(run_dir),
        ),
    )


def _comm_exposed(measured: CommExposedRecord, recorded: RunSummary) -> CommExposedRecord:
    """summary.json's ``comm_exposed``: the seconds a step measured blocked in collectives, with the
    plan's exposed communication per step beside them (recorded at launch)."""
    planned = (recorded.step_time or {}).get("comm_exposed_s")
    return {**measured, "planned_seconds_per_step": planned}


def _host_memory(recorded: RunSummary, last: dict[str, float]) -> HostMemoryRecord:
    """summary.json's ``host_memory``: the plan's (recorded at launch) with the measured peak beside it."""
    return {
        **(recorded.host_memory or HostMemoryRecord()),
        "measured_per_rank_gb": last.get("memory/host_peak_gb"),
        "measured": "the process's high-water RSS since it started, the most over ranks",
    }
