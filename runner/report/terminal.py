"""The report's rows as rich tables in the terminal, best values highlighted, errors listed below.

Layout and speed in one table (two when the terminal is narrow), then memory per term with
two lines per cell, estimated and measured: each table fits an 80-column terminal.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from runner.metrics import goodput
from runner.metrics.step_spread import NOISY_ABOVE
from runner.metrics.wall_clock import SHOWN_IF_SPENT
from runner.report.compare import LossAgreement
from runner.report.rows import (
    BEST_PEAK,
    COLUMN_MEANINGS,
    DISPLAY_COLUMNS,
    MARKED_COLUMN,
    TERMS,
    Column,
    Row,
    fmt_gb,
)
from runner.rundir.summary import RunStatus

# Yellow: may still finish (interrupted: stopped at a signal after a checkpoint, to be resumed).
_STATUS_STYLE = {
    RunStatus.completed: "green",
    RunStatus.running: "yellow",
    "unfinished": "yellow",
    RunStatus.interrupted: "yellow",
    "planned": "cyan",
}
_BY_HEADER = {c.header: c for c in DISPLAY_COLUMNS}
# The default table: what tells the cells apart first, narrow enough for 120 columns.
TELLING_COLUMNS = (
    "cell",
    "overrides",
    "tokens/s/device",
    "MFU %",
    "peak GB",
    "step s",
    "final loss",
    "wall s (steps %)",
    "status",
    "best",
)
LAYOUT_COLUMNS = ("cell", "overrides", "parallel", "gpus", "dp·tp·pp·sp", "micro", "accum", "global")
SPEED_COLUMNS = (
    "tokens/s/device",
    "MFU %",
    "step s",
    "pred step s",
    "step IQR %",
    "step % fwd / bwd / opt / comm / p2p",
    "final loss",
    "status",
    "best",
)


def with_eval_loss(headers: Sequence[str], rows: Sequence[Row]) -> tuple[str, ...]:
    """``headers`` with the held-out loss after the final loss, where some row was evaluated."""
    if not any(row.eval_loss is not None for row in rows):
        return tuple(headers)
    at = list(headers).index("final loss") + 1
    return (*headers[:at], "eval loss", *headers[at:])


# Shorter headers where the table's title already gives the unit.
_SHORT = {
    "eval loss": "eval",
    "tokens/s/device": "tok/s/dev",
    "final loss": "loss",
    "step % fwd / bwd / opt / comm / p2p": "fwd/bwd/opt/comm/p2p %",
    "step IQR %": "IQR %",
}


def _cell(column: Column, row: Row) -> Text:
    value = column.show(row)
    if column.header == "best":
        return Text("★ " + value if value else "", style="bold green")
    if column.header == "status":
        return Text(value, style=_STATUS_STYLE.get(value, "bold red"))
    if column.header == "step IQR %" and row.noisy:
        return Text(value, style="bold yellow")
    marked = {MARKED_COLUMN[m] for m in row.best}
    return Text(value, style="bold green" if column.header in marked else "")


def rows_table(rows: Sequence[Row], *, headers: Sequence[str], title: str) -> Table:
    """A rich Table of the given display columns, one line per cell; best values in bold green."""
    table = Table(
        title=title, box=box.SIMPLE_HEAD, header_style="bold", title_justify="left", collapse_padding=True
    )
    cells = [[_cell(_BY_HEADER[h], row) for h in headers] for row in rows]
    for at, header in enumerate(headers):
        column = _BY_HEADER[header]
        flexible = header == "overrides"  # the one column that may wrap
        widest = max((len(line[at]) for line in cells), default=0)
        table.add_column(
            _SHORT.get(header, header),
            justify="right" if column.numeric else "left",
            no_wrap=not flexible,
            overflow="fold" if flexible else "ellipsis",
            ratio=1 if flexible else None,
            # Numbers are never cut: a narrow terminal shortens the names and headers instead.
            min_width=12 if flexible else widest if column.numeric else None,
        )
    for line in cells:
        table.add_row(*line)
    return table


def memory_table(rows: Sequence[Row], *, title: str) -> Table:
    """Memory per term, two lines per cell: the estimate (with its total) and the measurement
    (with the residual up to the measured peak, which is its total); a third, ``plan``, where
    the run recorded the peak its plan put on the device at launch (plan=true's total)."""
    devices = {r.device_memory_gb for r in rows if r.device_memory_gb is not None}
    one_device = len(devices) <= 1  # then the title says it, and a column would repeat it
    if devices and one_device:
        title += f"; device memory {fmt_gb(next(iter(devices)))} GB"
    table = Table(title=title, box=box.SIMPLE_HEAD, header_style="bold", title_justify="left", pad_edge=False)
    table.add_column("cell", no_wrap=True)
    table.add_column("", no_wrap=True)
    for header in (*TERMS, "residual", "total", *(() if one_device else ("device",))):
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        device = () if one_device else (fmt_gb(row.device_memory_gb),)
        estimated = (fmt_gb(row.est_gb.get(t)) for t in TERMS)
        table.add_row(row.cell_id, "est", *estimated, "", fmt_gb(row.est_gb.get("total")), *device)
        measured = (fmt_gb(row.measured_gb.get(t)) for t in TERMS)
        peak = Text(fmt_gb(row.peak_gb), style="bold green" if BEST_PEAK in row.best else "")
        blank = () if one_device else ("",)
        planned = row.planned_peak_gb is not None
        table.add_row("", "meas", *measured, fmt_gb(row.residual()), peak, *blank, end_section=not planned)
        if planned:
            no_terms = [""] * (len(TERMS) + 1)  # the plan's terms are plan=true's table
            table.add_row("", "plan", *no_terms, fmt_gb(row.planned_peak_gb), *blank, end_section=True)
    return table


WALL_PARTS = (
    "prelaunch",
    "calibration",
    "launch",
    "build",
    "engine",
    "resume",
    "setup",
    "steps",
    "checkpoint",
    "eval",
    "other",
)
_WALL_SHORT = {"checkpoint": "ckpt", "prelaunch": "pre", "calibration": "calib"}


def wall_table(rows: Sequence[Row], *, title: str) -> Table:
    """Where each cell's wall time went, in seconds (runner/metrics/wall_clock.py): its parts, which add up
    to the total, the steps' share, and the checkpoints' count and write speed. ``prelaunch``,
    ``calibration`` and ``resume`` show only where some cell spent time on them and ``eval`` where
    some cell evaluated, so the table
    fits 80 columns. Below it, a cell that took
    more than one attempt has its goodput across them (runner/metrics/goodput.py)."""
    shown = [r for r in rows if r.wall]
    spent = {p for p in SHOWN_IF_SPENT if any((r.wall.get(f"{p}_s") or 0) >= 0.05 for r in shown)}
    evaluated = any(r.wall.get("evaluations") for r in shown)
    parts = [p for p in WALL_PARTS if (p not in SHOWN_IF_SPENT or p in spent) and (p != "eval" or evaluated)]
    restarted = [f"{r.cell_id}: {line}" for r in shown if (line := goodput.describe(r.goodput))]
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        header_style="bold",
        title_justify="left",
        pad_edge=False,
        padding=0,  # the box's own space between columns: 12 of them fit 80 columns
        caption="\n".join(restarted) or None,
        caption_justify="left",
    )
    table.add_column("cell", no_wrap=True)
    for header in ("total", *(_WALL_SHORT.get(p, p) for p in parts), "steps%", "saves", "GB/s"):
        table.add_column(header, justify="right", no_wrap=True)
    for row in shown:
        wall = row.wall
        share = wall.get("steps_share")
        rate = wall.get("checkpoint_gb_per_s")
        table.add_row(
            row.cell_id,
            _seconds(wall.get("total_s")),
            *(_seconds(wall.get(f"{part}_s")) for part in parts),
            "–" if share is None else f"{100 * share:.0f}",
            str(wall.get("checkpoints") or 0),
            "–" if rate is None else f"{rate:.2f}",
        )
    return table


def _seconds(value: object) -> str:
    return f"{value:,.1f}" if isinstance(value, int | float) else "–"


def noisy_cells(rows: Sequence[Row]) -> str | None:
    """The line naming the cells whose step times spread wide, or None where none did."""
    noisy = [r.cell_id for r in rows if r.noisy]
    if not noisy:
        return None
    return (
        f"noisy: cell{'s' if len(noisy) > 1 else ''} {', '.join(noisy)}: the step times' IQR is above "
        f"{100 * NOISY_ABOVE:.0f}% of their median; another process shared the cores, so their tokens/s "
        "and MFU are not comparable: run them again on a quiet machine"
    )


def output_console(*, piped_width: int) -> Console:
    """A console for stdout: the terminal's width, or ``piped_width`` where stdout is a pipe or a
    file (there is no terminal to fit, so tables are not folded to 80 columns); COLUMNS wins."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=piped_width)
    return console


def legend(headers: Sequence[str]) -> list[str]:
    """One short line per shown column that needs saying, in the table's order (rows.py's meanings)."""
    lines = [f"{_SHORT.get(h, h)}: {COLUMN_MEANINGS[h]}" for h in headers if h in COLUMN_MEANINGS]
    return [COLUMN_MEANINGS["GB"], *lines]


def _print_tables(rows: Sequence[Row], *, console: Console, title: str, wide: bool) -> tuple[str, ...]:
    """The report's tables (see print_report); the display columns they showed."""
    if not wide:
        headers = with_eval_loss(TELLING_COLUMNS, rows)
        console.print(rows_table(rows, headers=headers, title=title))
        return headers
    speed = with_eval_loss(SPEED_COLUMNS, rows)
    table = rows_table(rows, headers=LAYOUT_COLUMNS + speed, title=f"{title}: layout and speed")
    if Measurement.get(console, console.options.update_width(1 << 16), table).maximum <= console.width:
        console.print(table)
    else:  # a narrow terminal: two tables rather than truncated numbers
        console.print(rows_table(rows, headers=LAYOUT_COLUMNS, title=f"{title}: layout"))
        console.print(rows_table(rows, headers=("cell", *speed), title="speed and loss"))
    console.print(memory_table(rows, title="memory per device, GB = 1e9 bytes"))
    if any(row.wall for row in rows):
        console.print(wall_table(rows, title="wall time per cell, s (rank 0, latest attempt)"))
    return (*LAYOUT_COLUMNS, *speed, "peak GB", "wall s (steps %)")


def print_report(
    rows: Sequence[Row],
    agreements: Sequence[LossAgreement],
    *,
    console: Console,
    title: str,
    wide: bool = False,
) -> None:
    """Print the tables, the legend, loss-curve verdicts and the error of each cell that did not complete.

    By default one table of the most telling columns, which fits 120 columns; ``wide``: every
    column, the layout's, the memory per term and the wall time's parts.
    """
    headers = _print_tables(rows, console=console, title=title, wide=wide)
    for line in legend(headers):
        console.print(Text(line, style="dim"), overflow="fold")
    if not wide:
        console.print(Text("--wide: every column, memory per term and the wall time's parts", style="dim"))
    for agreement in agreements:
        style = {True: "green", False: "bold red", None: "yellow"}[agreement.coincide]
        console.print(Text(f"{agreement.label}: {agreement.verdict()}", style=style))
    if noisy := noisy_cells(rows):
        console.print(Text(noisy, style="yellow"), soft_wrap=True)
    moved = [r for r in rows if r.layouts]
    if moved:  # their figures are their last layout's
        console.print(Text("cells resumed onto another layout:"))
        for row in moved:
            console.print(Text(f"  {row.cell_id}: {row.layouts}"), soft_wrap=True)
    errors = [r for r in rows if r.error]
    if errors:
        console.print(Text("cells that did not complete:", style="bold red"))
        for row in errors:
            console.print(Text(f"  {row.cell_id} ({row.status}): {row.error}"))
