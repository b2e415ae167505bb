"""The report's charts: memory per term per cell, the step's time per phase per cell, the run's
wall time by part per cell, MFU and
tokens/s per device against gpus for each parallel mode, the loss curves of all cells overlaid,
and their spread against the tolerance."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from runner.metrics import goodput
from runner.report.collect import Cell
from runner.report.compare import EVAL_LOSS, LossAgreement
from runner.report.rows import STEP_PHASES, TERMS, Row, fmt_gb
from runner.report.svg import Bar, HLine, Segment, Series, line_chart, stacked_bar_chart
from runner.rundir.summary import RunStatus

# Okabe & Ito's colour-blind-safe palette (yellow dropped: unreadable on white), then greys.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C564B", "#7F7F7F")
DASHES = ("", "7 4", "2 3", "9 3 2 3")
TERM_COLORS = {
    "params": "#0072B2",
    "grads": "#56B4E9",
    "optimizer": "#009E73",
    "activations": "#E69F00",
    "residual": "#B8B8B8",
}
PLANNED_PEAK_COLOR = "#CC79A7"  # the plan's peak at launch: one block, not split by term
REST_OF_PEAK = "rest of peak"  # the measured peak above the terms and the named residual lines
REST_OF_PEAK_COLOR = "#E4E4E4"
PHASE_COLORS = {
    "data": "#7F7F7F",
    "forward": "#0072B2",
    "backward": "#D55E00",
    "p2p": "#CC79A7",
    "optimizer": "#009E73",
    "other": "#B8B8B8",
}


@dataclass(frozen=True)
class LegendItem:
    """A swatch in a chart's legend."""

    name: str
    color: str
    dash: str = ""
    kind: str = "line"  # line | box


@dataclass(frozen=True)
class Chart:
    """One figure of the page: its SVG, legend, and a caption that says how to read it."""

    key: str
    title: str
    svg: str
    legend: list[LegendItem] = field(default_factory=list)
    caption: str = ""
    empty: bool = False


def _measured_segments(row: Row) -> list[Segment]:
    segments = [
        Segment(t, row.measured_gb[t], TERM_COLORS[t], f"{t} {fmt_gb(row.measured_gb[t])} GB measured")
        for t in TERMS
        if t in row.measured_gb
    ]
    residual = row.residual()
    if residual is None:
        return segments
    if row.residual_gb:
        what = ", ".join(f"{k} {fmt_gb(v)}" for k, v in row.residual_gb.items())
    else:
        # allocator caches, communication buffers, the runtime: what the four terms do not cover
        what = "peak - measured terms" if segments else "peak, not split by term"
    tip = f"residual {fmt_gb(residual)} GB ({what}); peak {fmt_gb(row.peak_gb)} GB"
    segments.append(Segment("residual", residual, TERM_COLORS["residual"], tip))
    return [*segments, *_rest_of_peak(row, sum(s.value for s in segments))]


def _rest_of_peak(row: Row, drawn: float) -> list[Segment]:
    """The block that takes the measured bar up to the measured peak, where the named residual lines
    stop short of it: on a CPU the process's runtime (its high-water RSS is the peak), on CUDA what
    the allocator held beyond the lines DeepSpeed's buffers are named by."""
    if row.peak_gb is None or row.peak_gb <= drawn * 1.001:  # within rounding: nothing to draw
        return []
    rest = row.peak_gb - drawn
    what = (
        "torch's and DeepSpeed's runtime and the allocator's slack: the peak is the process's high-water RSS"
        if row.peak_is_host_rss
        else "held by the allocator beyond the terms and the named lines"
    )
    tip = f"{REST_OF_PEAK} {fmt_gb(rest)} GB ({what}); peak {fmt_gb(row.peak_gb)} GB"
    return [Segment(REST_OF_PEAK, rest, REST_OF_PEAK_COLOR, tip)]


def memory_chart(rows: Sequence[Row]) -> Chart:
    """Per cell, estimated and measured stacked bars of the four terms (+ residual), against device memory."""
    bars: list[Bar] = []
    for row in rows:
        est = [
            Segment(t, row.est_gb[t], TERM_COLORS[t], f"{t} {fmt_gb(row.est_gb[t])} GB estimated")
            for t in TERMS
            if t in row.est_gb
        ]
        measured = _measured_segments(row)
        if est:
            bars.append(Bar("est", row.cell_id, est, row.device_memory_gb))
        if measured:
            bars.append(Bar("meas", row.cell_id, measured, row.device_memory_gb))
        if row.planned_peak_gb is not None:
            tip = f"planned peak {fmt_gb(row.planned_peak_gb)} GB (plan=true's total, made at launch)"
            planned = [Segment("planned peak", row.planned_peak_gb, PLANNED_PEAK_COLOR, tip)]
            bars.append(Bar("plan", row.cell_id, planned, row.device_memory_gb))
    legend = [LegendItem(t, c, kind="box") for t, c in TERM_COLORS.items()]
    if any(s.name == REST_OF_PEAK for bar in bars for s in bar.segments):
        legend.append(LegendItem(REST_OF_PEAK, REST_OF_PEAK_COLOR, kind="box"))
    if any(r.planned_peak_gb is not None for r in rows):
        legend.append(LegendItem("planned peak", PLANNED_PEAK_COLOR, kind="box"))
    legend.append(LegendItem("device memory", "#c0392b", dash="6 4"))
    devices = {r.device_memory_gb for r in rows if r.device_memory_gb is not None}
    device_note = (
        f"Dashed red: device memory ({', '.join(fmt_gb(d) for d in sorted(devices))} GB); "
        "an arrow at the top when it is far above the bars."
        if devices
        else "No cell recorded its device memory."
    )
    return Chart(
        key="memory",
        title="Memory per device by term (GB = 1e9 bytes)",
        svg=stacked_bar_chart(bars, title="Memory per device by term", y_label="GB per device", unit="GB"),
        legend=legend,
        caption=(
            "For each cell, left bar (est): the estimate of the four terms; next (meas): the measured "
            "terms plus the residual, up to the measured peak (on a CPU the process's high-water RSS, "
            "whose rest of peak is torch's runtime); last (plan), where the run recorded it: "
            f"the peak its plan put on the device at launch. {device_note}"
        ),
        empty=not bars,
    )


def time_chart(rows: Sequence[Row]) -> Chart:
    """Per cell, the optimizer step's seconds stacked by phase; exposed communication in each tooltip."""
    bars: list[Bar] = []
    for row in rows:
        phases = [p for p in STEP_PHASES if p in row.time_s]
        if not phases:
            continue
        comm = row.time_s.get("comm_exposed")
        comm_note = "" if comm is None else f"; {comm:.3g} s of the step blocked in collectives"
        segments = [
            Segment(p, row.time_s[p], PHASE_COLORS[p], f"{p} {row.time_s[p]:.3g} s per step{comm_note}")
            for p in phases
        ]
        bars.append(Bar("", row.cell_id, segments))
    shown = {segment.name for bar in bars for segment in bar.segments}
    return Chart(
        key="time",
        title="Time per optimizer step by phase (seconds)",
        svg=stacked_bar_chart(
            bars, title="Time per optimizer step by phase", y_label="seconds per step", unit="s"
        ),
        legend=[LegendItem(p, c, kind="box") for p, c in PHASE_COLORS.items() if p in shown],
        caption=(
            "For each cell, the seconds of one optimizer step (median over the steps after the first), "
            "split into the phases that partition it: batch fetch, forward, backward, optimizer step, "
            "the rest, and under a pipeline p2p: the stage-to-stage sends and receives, with the waits "
            "for the neighbouring stage (the bubble). The global batch is the experiment, so cells "
            "compare step for step. Exposed communication lies inside the phases (ZeRO's reductions in "
            "backward) and is given in each bar's tooltip."
        ),
        empty=not bars,
    )


# Where a run's wall time goes (runner/metrics/wall_clock.py), in the order the chart stacks them.
WALL_COLORS = {
    "prelaunch": "#999933",
    "calibration": "#DDCC77",
    "launch": "#56B4E9",
    "build": "#E69F00",
    "engine": "#CC79A7",
    "resume": "#8C564B",
    "setup": "#7F7F7F",
    "steps": "#0072B2",
    "checkpoint": "#D55E00",
    "eval": "#009E73",
    "other": "#B8B8B8",
}


def wall_chart(rows: Sequence[Row]) -> Chart:
    """Per cell, the latest attempt's wall time stacked by part: start-up, steps, checkpoints, the rest."""
    bars: list[Bar] = []
    for row in rows:
        wall = row.wall
        parts = [(p, wall.get(f"{p}_s")) for p in WALL_COLORS]
        shown = [(p, float(v)) for p, v in parts if isinstance(v, int | float) and v > 0]
        if not shown:
            continue
        total = wall.get("total_s") or sum(v for _, v in shown)
        segments = [
            Segment(p, v, WALL_COLORS[p], f"{p} {v:.3g} s, {100 * v / total:.0f}% of {total:.3g} s")
            for p, v in shown
        ]
        bars.append(Bar("", row.cell_id, segments))
    drawn = {segment.name for bar in bars for segment in bar.segments}
    return Chart(
        key="wall",
        title="Wall time of the run by part (seconds)",
        svg=stacked_bar_chart(bars, title="Wall time of the run by part", y_label="seconds", unit="s"),
        legend=[LegendItem(p, c, kind="box") for p, c in WALL_COLORS.items() if p in drawn],
        caption=(
            "For each cell, the latest attempt's wall time on rank 0 from its command's start: prelaunch "
            "(the launching process before the ranks), calibration (its step-time model measuring the "
            "device), launch (interpreter, imports, process group), build (the model), "
            "engine (deepspeed.initialize), "
            "resume (loading a checkpoint), setup (the rest before the first step), the optimizer steps, "
            "the checkpoint saves, the held-out evaluations and what lies between the steps. "
            "The steps' share is the attempt's goodput."
            + "".join(f" Cell {r.cell_id}, {line}." for r in rows if (line := goodput.describe(r.goodput)))
        ),
        empty=not bars,
    )


def _mode(row: Row, with_precision: bool) -> str:
    mode = row.parallel or "?"
    return f"{mode} {row.precision}" if with_precision else mode


def scaling_chart(rows: Sequence[Row], *, metric: str) -> Chart:
    """MFU (%) or tokens/s per device against gpus, one line per parallel mode."""
    if metric == "mfu":
        title, y_label = "MFU against gpus", "MFU (%)"

        def value(r: Row) -> float | None:
            return None if r.mfu is None else 100 * r.mfu
    else:
        title, y_label = "Tokens/s per device against gpus", "tokens/s per device"

        def value(r: Row) -> float | None:
            return r.tokens_per_s_per_device

    # Completed cells only: a failed cell's speed covers a few steps, or the steps before it broke.
    usable = [
        r for r in rows if r.status == RunStatus.completed and r.gpus is not None and value(r) is not None
    ]
    gpus = sorted({r.gpus for r in usable if r.gpus is not None})
    position = {g: float(i) for i, g in enumerate(gpus)}  # gpus as categories: 1, 2, 8, 64 evenly spaced
    with_precision = len({r.precision for r in usable}) > 1
    modes: dict[str, list[tuple[float, float]]] = {}
    for row in usable:
        v = value(row)
        assert row.gpus is not None and v is not None
        modes.setdefault(_mode(row, with_precision), []).append((position[row.gpus], v))
    series = [
        Series(mode, points, PALETTE[i % len(PALETTE)], DASHES[(i // len(PALETTE)) % len(DASHES)])
        for i, (mode, points) in enumerate(sorted(modes.items()))
    ]
    svg = line_chart(
        series,
        title=title,
        x_label="gpus (ranks)",
        y_label=y_label,
        x_ticks=[(p, str(g)) for g, p in position.items()],
    )
    return Chart(
        key=metric,
        title=title,
        svg=svg,
        legend=[LegendItem(s.name, s.color, s.dash) for s in series],
        caption="Completed cells; medians over the logged steps after the first; one point per cell.",
        empty=not series,
    )


def loss_chart(
    cells: Sequence[Cell], order: Sequence[str], labels: dict[str, str], *, metric: str = "loss"
) -> Chart:
    """Loss (or the held-out ``eval/loss``) against step for every cell that logged it, overlaid;
    line widths differ so equal curves show."""
    by_id = {c.cell_id: c for c in cells}
    curves = [
        (cid, by_id[cid].loss_curve(metric))
        for cid in order
        if cid in by_id and by_id[cid].loss_curve(metric)
    ]
    n = len(curves)
    series = [
        Series(
            cid,
            sorted((float(s) + 1, v) for s, v in curve.items()),  # step 1 is index 0, as the console counts
            PALETTE[i % len(PALETTE)],
            DASHES[i % len(DASHES)],
            # widest first, so curves that coincide show as nested lines rather than one
            width=1.5 + 4.0 * (n - 1 - i) / max(n - 1, 1),
        )
        for i, (cid, curve) in enumerate(curves)
    ]
    held_out = metric == EVAL_LOSS
    what = "held-out loss" if held_out else "loss"
    return Chart(
        key="eval_loss" if held_out else "loss",
        title=f"{what.capitalize()} curves of all cells",
        svg=line_chart(
            series, title=f"{what.capitalize()} against step", x_label="step", y_label=what, y_from_zero=False
        ),
        legend=[LegendItem(f"{s.name} {labels.get(s.name, '')}".strip(), s.color, s.dash) for s in series],
        caption=f"Each cell's {what} per "
        + ("evaluation (train.eval_every)" if held_out else "logged step")
        + "; coinciding curves show as nested lines of unequal widths.",
        empty=not series,
    )


def spread_chart(agreements: Sequence[LossAgreement]) -> Chart:
    """The spread (max - min loss across cells) at each common step, per group, against its tolerance."""
    compared = [a for a in agreements if a.steps]
    series = []
    hlines = []
    for i, agreement in enumerate(compared):
        name = f"model {agreement.model}, global {agreement.global_size}"
        name += ", held-out" if agreement.metric == EVAL_LOSS else ""
        series.append(
            Series(
                name,
                [(float(s) + 1, d) for s, d in zip(agreement.steps, agreement.spread, strict=True)],
                PALETTE[i % len(PALETTE)],
            )
        )
        hlines.append(HLine(agreement.tolerance, f"tolerance {agreement.tolerance:.0e}"))
    svg = line_chart(
        series,
        title="Spread of loss across cells",
        x_label="step",
        y_label="max - min loss across cells",
        hlines=hlines,
    )
    return Chart(
        key="spread",
        title="Do the loss curves coincide?",
        svg=svg,
        legend=[LegendItem(s.name, s.color) for s in series] + [LegendItem("tolerance", "#c0392b", "6 4")],
        caption="At each step logged by at least two cells of a group (same model, same global batch; "
        "for the held-out loss, the same held-out batches), of the loss and of the held-out loss.",
        empty=not series,
    )
