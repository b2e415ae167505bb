"""The name of every file and folder a run directory holds, and two of its records: DeepSpeed's
config and the failure records.

summary.json             the run's status, layout and results (runner/rundir/summary.py)
metrics.jsonl            one JSON object per logged step (runner/rundir/metrics_file.py)
attempts.jsonl           each attempt's start, progress and end (runner/metrics/goodput.py)
deepspeed_config.json    build_deepspeed_config's output (the launching process writes it, here)
plan.json                the plan of a run or of plan=true (launchers/plan_job.py writes it)
failure_rank<N>.json     a failed rank's error (the rank writes it, here)
train.log                Hydra's job log (train.py's job), which rank 0 of the local launcher
                         appends to (launchers/worker.py)
checkpoints/             the checkpoints (runner/checkpoint/save.py), and latest.json, the record
                         of the newest (runner/rundir/checkpoint_record.py)
profile/                 the step profiler's traces (runner/metrics/step_profiler.py)
.hydra/                  Hydra's config.yaml, hydra.yaml and overrides.yaml of the latest attempt
                         that ran, and .before-this-attempt/ while one starts (launchers/hydra_files.py)
earlier_attempts/<n>/    an attempt that started over (launchers/hydra_files.py)

A sweep's directory holds its cells' run directories and Hydra's multirun.yaml (with its own
.before-this-attempt/ while a resumed sweep starts).
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

from runner.rundir.atomic_json import write_json_atomic
from runner.rundir.json_types import JsonObject

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
ATTEMPTS_FILE = "attempts.jsonl"
DEEPSPEED_CONFIG_FILE = "deepspeed_config.json"
PLAN_FILE = "plan.json"
FAILURE_FILES = "failure_rank*.json"  # every rank's failure record, as a glob (failure_file names one)
TRAIN_LOG = "train.log"  # Hydra's job log: <job name>.log, the job being train.py
CHECKPOINT_DIR = "checkpoints"
LATEST_FILE = "latest.json"  # in checkpoints/
PROFILE_DIR = "profile"
HYDRA_DIR = ".hydra"
HYDRA_CONFIG_FILE = "config.yaml"  # in .hydra/: the composed config
HYDRA_OVERRIDES_FILE = "overrides.yaml"  # in .hydra/: the command line's overrides
# Every file Hydra writes in .hydra/: the composed config, Hydra's own, the overrides.
HYDRA_RUN_FILES = (HYDRA_CONFIG_FILE, "hydra.yaml", HYDRA_OVERRIDES_FILE)
EARLIER_ATTEMPTS_DIR = "earlier_attempts"
SET_ASIDE_DIR = ".before-this-attempt"  # in .hydra/ and a sweep's directory
MULTIRUN_FILE = "multirun.yaml"  # in a sweep's directory


def failure_file(rank: int) -> str:
    """The name of rank ``rank``'s failure record."""
    return f"failure_rank{rank}.json"


def write_deepspeed_config(run_dir: Path, ds_config: JsonObject) -> None:
    """Keep the exact DeepSpeed config of the run beside its results."""
    write_json_atomic(run_dir / DEEPSPEED_CONFIG_FILE, ds_config)


def add_note(error: BaseException, words: str) -> None:
    """``error.add_note(words)`` (PEP 678) by hand: ``add_note`` itself is Python 3.11+."""
    notes = getattr(error, "__notes__", None)
    if notes is None:
        notes = []
        error.__notes__ = notes  # type: ignore[attr-defined]
    notes.append(words)


def with_notes(error: BaseException) -> str:
    """``Type: message``, then the error's notes (PEP 678: runner/diagnose/out_of_memory.py,
    runner/diagnose/peer_loss.py)."""
    notes = getattr(error, "__notes__", None) or []
    return "; ".join([f"{type(error).__name__}: {error}", *notes])


def write_failure(run_dir: Path, *, rank: int, error: BaseException, trace: str | None = None) -> None:
    """Record why a rank failed, for the launcher's summary."""
    write_json_atomic(
        run_dir / failure_file(rank),
        {
            "rank": rank,
            "time": time.time(),
            "error": with_notes(error),
            "traceback": trace or "".join(traceback.format_exception(error)),
        },
    )


def read_failures(run_dir: Path) -> list[dict[str, Any]]:
    """Every failure record of the run, first failure first.

    The rank that failed first is the cause; the others then fail on a collective whose
    peer has gone ("Connection closed by peer").
    """
    records = []
    for path in sorted(run_dir.glob(FAILURE_FILES)):
        with path.open() as handle:
            records.append(json.load(handle))
    return sorted(records, key=lambda r: (float(r.get("time", 0.0)), int(r["rank"])))
