"""What a sweep (``-m``) prints once its last cell is done: one table of its cells, and the command
that compares them in full.

Both launcher plugins call it after every cell ran (hydra_plugins/ladder_local and ladder_slurm),
so a sweep no longer ends on its last cell's own tables. The rows are ``ladder report``'s
(runner/report): read from each cell's directory, in job-number order, with what a cell that
failed or never started left.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.console import Console
from rich.text import Text

from runner.report.collect import ReportInputError, collect
from runner.report.rows import Row, build_rows
from runner.report.terminal import noisy_cells, output_console, rows_table
from runner.rundir.summary import RunStatus

SWEEP_HEADERS = (
    "cell",
    "overrides",
    "status",
    "tokens/s/device",
    "MFU %",
    "step IQR %",
    "peak GB",
    "final loss",
)


def report_command(sweep_dir: Path) -> str:
    """``ladder report <sweep dir>``, quoted for a shell, as the directory was given to Hydra."""
    return f"ladder report {shlex.quote(str(sweep_dir))}"


def sweep_rows(sweep_dir: Path) -> list[Row]:
    """The report's rows of the sweep's cells, in job-number order; none where it holds no cell."""
    try:
        return build_rows(collect([sweep_dir]))
    except ReportInputError:  # every cell was refused before its directory held a file
        return []


def print_sweep_end(sweep_dir: Path, *, console: Console | None = None) -> None:
    """The sweep's cells in one table (status, speed, MFU, peak, final loss), then how to compare them."""
    console = console or output_console(piped_width=120)
    rows = sweep_rows(sweep_dir)
    launched = [r for r in rows if r.status != "planned"]  # a sweep of plans printed each plan
    if launched:
        done = sum(r.status == RunStatus.completed for r in rows)
        # The directory on a line of its own: as the table's title it would wrap at the table's width.
        console.print(
            Text(f"sweep {sweep_dir}: {done} of {len(rows)} cells completed", style="bold"), soft_wrap=True
        )
        console.print(rows_table(rows, headers=SWEEP_HEADERS, title=""))
        if noisy := noisy_cells(rows):
            console.print(Text(noisy, style="yellow"), soft_wrap=True)
    command = report_command(sweep_dir)
    console.print(Text(f"compare the cells: {command}  (--html report.html for charts)"), soft_wrap=True)
