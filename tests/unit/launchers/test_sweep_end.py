"""The end of a sweep: one table of its cells (status, tokens/s, MFU, step spread, peak, final loss) in
job-number order, and the exact ``ladder report`` command that compares them."""

from __future__ import annotations

import io
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from launchers.sweep_end import print_sweep_end, report_command

pytestmark = pytest.mark.unit


def write_cell(cell: Path, *, parallel: str, status: str | None, mfu: float, step_s: list[float]) -> None:
    """A cell's directory as train.py leaves it: .hydra/, metrics.jsonl and (status given) summary.json."""
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"parallel={parallel}", "train.steps=4"]))
    (cell / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"gpus": 2, "parallel": {"name": parallel}}))
    losses = [5.0 - 0.5 * step for step in range(len(step_s))]
    records = [
        {
            "step": step,
            "loss": loss,
            "time/step_s": seconds,
            "throughput/mfu": mfu,
            "throughput/tokens_per_s_per_device": 4000 * mfu,
            "memory/peak_gb": 0.73,
        }
        for step, (loss, seconds) in enumerate(zip(losses, step_s, strict=True))
    ]
    (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if status is not None:
        summary: dict[str, Any] = {"status": status, "parallel": parallel, "steps_completed": len(losses)}
        if status == "failed":
            summary |= {"error": "RuntimeError: fault injected", "failed_rank": 1}
        (cell / "summary.json").write_text(json.dumps(summary))


def printed(sweep: Path) -> str:
    """What the sweep's end prints to a log 120 columns wide."""
    out = io.StringIO()
    print_sweep_end(sweep, console=Console(width=120, file=out))
    return out.getvalue()


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Cells 0-3 and 10, written out of order: 3 fastest, 1 failed, 10 noisy, 2 without a summary."""
    root = tmp_path / "multirun" / "12-00-00"
    steady = [2.0, 0.5, 0.5, 0.5, 0.5]
    write_cell(root / "3", parallel="zero3", status="completed", mfu=0.40, step_s=steady)
    write_cell(root / "1", parallel="zero1", status="failed", mfu=0.30, step_s=steady[:2])
    write_cell(root / "10", parallel="zero2", status="completed", mfu=0.31, step_s=[2.0, 0.5, 1.0, 0.5, 1.1])
    write_cell(root / "2", parallel="zero2", status=None, mfu=0.20, step_s=steady)
    write_cell(root / "0", parallel="ddp", status="completed", mfu=0.25, step_s=steady)
    return root


def test_the_sweep_ends_with_its_cells_in_job_order_and_the_report_command(sweep):
    out = printed(sweep)
    lines = [line.split() for line in out.splitlines()]
    cells = [words[0] for words in lines if words and re.fullmatch(r"\d+", words[0])]
    assert cells == ["0", "1", "2", "3", "10"]
    assert f"sweep {sweep}: 3 of 5 cells completed" in out
    row = next(words for words in lines if words[:1] == ["3"])
    assert row == ["3", "parallel=zero3", "completed", "1,600", "40.0", "0", "0.730", "3.0000"]
    assert next(words for words in lines if words[:1] == ["1"])[2] == "failed"
    assert next(words for words in lines if words[:1] == ["2"])[2] == "unfinished"
    assert "noisy: cell 10" in out
    assert out.rstrip().endswith(f"compare the cells: ladder report {sweep}  (--html report.html for charts)")


def test_the_command_is_quoted_for_the_shell():
    where = Path("multirun/my sweep")
    assert report_command(where) == "ladder report 'multirun/my sweep'"
    assert shlex.split(report_command(where))[2] == "multirun/my sweep"


def test_a_sweep_whose_cells_left_nothing_still_says_where_it_went(tmp_path):
    (tmp_path / "sweep").mkdir()
    out = printed(tmp_path / "sweep")
    assert "cells completed" not in out
    assert f"compare the cells: ladder report {tmp_path / 'sweep'}" in out
