"""What a finished run prints last: its speed and its memory ledger, as ``ladder report`` shows them.

The launching process prints it once every rank is done (rank 0 where torchrun or srun
started the ranks), from the run's own files, so the console ends with where the memory
and the time went rather than with the last step's line.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.text import Text

from runner.metrics import goodput, step_spread, wall_clock
from runner.report.collect import read_cell
from runner.report.rows import Row, fmt_gb, row_of
from runner.report.terminal import memory_table, output_console, rows_table, with_eval_loss
from runner.rundir.layout_history import describe

SPEED_HEADERS = (
    "tokens/s/device",
    "MFU %",
    "step s",
    "pred step s",
    "step IQR %",
    "step % fwd / bwd / opt / comm / p2p",
    "final loss",
    "status",
)


def print_run_end(run_dir: Path, *, console: Console | None = None) -> None:
    """The run's speed (medians after the first step) and memory per term, estimated and measured."""
    console = console or output_console(piped_width=120)
    cell = read_cell(run_dir, cell_id=run_dir.name)
    row = row_of(cell)
    speed_title = "speed, medians over the steps after the first"
    console.print(
        rows_table([row], headers=("cell", *with_eval_loss(SPEED_HEADERS, [row])), title=speed_title)
    )
    console.print(memory_table([row], title="memory per device, GB = 1e9 bytes"))
    if row.peak_is_host_rss:
        console.print(Text(cpu_total_note(row), style="dim"), soft_wrap=True)
    summary = cell.summary
    noisy = step_spread.describe(summary.step_time_spread)
    if noisy is not None:
        console.print(Text(noisy, style="yellow"), soft_wrap=True)
    changed = describe(summary.layout_history)
    if changed is not None:  # resumed onto another layout: the tables are the last one's
        console.print(Text(changed), soft_wrap=True)
    wall = wall_clock.describe(summary.wall_time)
    if wall is not None:
        console.print(Text(wall), soft_wrap=True)
    across = goodput.describe(summary.goodput)
    if across is not None:  # resumed: the time of every attempt, and what restarts cost
        console.print(Text(across), soft_wrap=True)
    note = f"details: ladder report {run_dir} (--html report.html for charts; several runs to compare them)"
    console.print(Text(note, style="dim"), soft_wrap=True)


def cpu_total_note(row: Row) -> str:
    """What the measured total is where the CPU is the device: no allocator there reports a peak
    of tensors, so it is the process's RSS, which the device plan (tensors only) leaves out."""
    planned = row.planned_host_gb
    host = "" if planned is None else f"; plan=true's host memory for a rank: {fmt_gb(planned)} GB"
    return (
        "on a CPU the measured total is the process's high-water RSS: the terms, plus torch and "
        f"DeepSpeed's runtime and the allocator's slack, which the plan's device total leaves out{host}"
    )
