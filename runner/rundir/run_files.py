"""The files of a run directory beside summary.json: DeepSpeed's config and the failure records.

deepspeed_config.json    build_deepspeed_config's output (the launching process writes it)
plan.json                the plan of a run or of plan=true (launchers/plan_job.py writes it)
failure_rank<N>.json     a failed rank's error (the rank writes it)

earlier_attempts/<n>/ (an attempt that started over) is launchers/hydra_files.py's.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

from runner.rundir.atomic_json import write_json_atomic

DEEPSPEED_CONFIG_FILE = "deepspeed_config.json"
PLAN_FILE = "plan.json"


def write_deepspeed_config(run_dir: Path, ds_config: dict[str, Any]) -> None:
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
        run_dir / f"failure_rank{rank}.json",
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
    for path in sorted(run_dir.glob("failure_rank*.json")):
        with path.open() as handle:
            records.append(json.load(handle))
    return sorted(records, key=lambda r: (float(r.get("time", 0.0)), int(r["rank"])))
