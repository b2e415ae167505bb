"""Metric sinks behind one small interface: JSONL (always), wandb, and the console
(runner/metrics/console.py); JSONL's file is runner/rundir/metrics_file.py's.

A sink receives ``log(step, metrics)`` for each logged step and ``close(summary)``
once. Adding a sink touches no training code: :func:`build_sinks` is the only place
that knows them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Protocol

from runner.config import LoggerConfig, WandbMode
from runner.exit_codes import ExitCode
from runner.metrics.console import ConsoleSink
from runner.rundir.metrics_file import JsonlSink, metrics_path
from runner.rundir.summary import RunStatus

log = logging.getLogger("ladder")


class MetricSink(Protocol):
    """Where per-step metrics go."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of optimizer step ``step``."""

    def close(self, summary: dict[str, Any]) -> None:
        """Flush and finish with the run's summary."""


class WandbSink:
    """One wandb run per Hydra job: offline by default, grouped by sweep, named by overrides."""

    def __init__(
        self,
        logger: LoggerConfig,
        *,
        run_dir: Path,
        name: str,
        group: str | None,
        config: dict[str, Any],
        run_id: str,
    ) -> None:
        import wandb  # deferred: seconds to import, and only a run that logs to wandb needs it

        if logger.base_url:
            os.environ["WANDB_BASE_URL"] = logger.base_url
        os.environ.setdefault("WANDB_SILENT", "true")
        self._run = wandb.init(
            project=logger.project,
            entity=logger.entity,
            mode=logger.mode.value,
            dir=str(run_dir),
            name=name,
            group=group,
            config=config,
            id=run_id,
            resume="allow",
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )

        self._lost_at: int | None = None  # the step at which wandb stopped taking metrics

    def _lost(self, step: int, error: Exception) -> None:
        """A logger must not end a run: say once what wandb missed, and write to it no more.

        E.g. its service process was killed: the ``deepspeed`` launcher ends each rank's
        process tree at Ctrl-C, wandb's service first. metrics.jsonl and summary.json are whole.
        """
        self._lost_at = step
        log.warning(
            "wandb stopped taking metrics at step %d (%s: %s); metrics.jsonl and summary.json "
            "hold the whole run, and the wandb run ends at the last step it took",
            step,
            type(error).__name__,
            error,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Send the step's metrics."""
        if self._lost_at is not None:
            return
        try:
            self._run.log(metrics, step=step)
        except Exception as error:
            self._lost(step, error)

    def close(self, summary: dict[str, Any]) -> None:
        """Mirror summary.json into the run's summary and finish."""
        if self._lost_at is not None:
            return
        try:
            for key, value in _flatten(summary).items():
                self._run.summary[key] = value
            if summary.get("status") == RunStatus.interrupted:  # stopped at a signal; resumes into this run
                self._run.mark_preempting()
            completed = summary.get("status") == RunStatus.completed
            self._run.finish(exit_code=ExitCode.OK if completed else ExitCode.FAILED)
        except Exception as error:
            self._lost(int(summary.get("steps_completed") or 0), error)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def build_sinks(
    logger: LoggerConfig,
    *,
    run_dir: Path,
    total_steps: int,
    name: str,
    group: str | None,
    config: dict[str, Any],
    run_id: str,
) -> list[MetricSink]:
    """The sinks of rank 0: JSONL always, the console, and wandb unless disabled."""
    sinks: list[MetricSink] = [JsonlSink(metrics_path(run_dir))]
    if logger.progress:
        sinks.append(ConsoleSink(total_steps))
    if logger.name == "wandb" and logger.mode != WandbMode.disabled:
        sinks.append(WandbSink(logger, run_dir=run_dir, name=name, group=group, config=config, run_id=run_id))
    return sinks
