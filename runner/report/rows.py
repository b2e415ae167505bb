"""One row per cell: layout, memory per term, speed, loss and status; sorted, best cells marked.

Units: memory in GB = 1e9 bytes (as summary.json and metrics.jsonl record it); MFU as a
fraction of peak (shown as %); throughput in tokens/s per device.

Speed is the median over the logged steps after the first (step 0 includes warm-up, and a
shared host makes single steps noisy), falling back to summary.json's final values. A cell
whose step times spread more than a quarter of their median is flagged noisy
(runner/metrics/step_spread.py): its speed is the machine's load as much as its layout's.

Cells keep their order: a sweep's by job number (0, 1, ..., 10), as its directories are named.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.metrics import goodput
from runner.metrics.step_spread import NOISY_ABOVE, step_time_spread
from runner.report.collect import Cell, distinguishing_overrides, natural_key
from runner.rundir.layout_history import describe
from runner.rundir.summary import RunStatus
from runner.rundir.summary_records import StepTimeSpread

# The four memory terms of a training step (DESIGN.md: parameters, gradients, optimizer states,
# activations), in the order the memory chart stacks them.
TERMS = ("params", "grads", "optimizer", "activations")
TOKENS_PER_DEVICE = "throughput/tokens_per_s_per_device"
MFU = "throughput/mfu"
# The phases that partition a step (runner/metrics/phase_clock.py), in the order the time chart stacks them;
# p2p (stage-to-stage sends and receives, with the waits: the bubble) only under a pipeline.
STEP_PHASES = ("data", "forward", "backward", "p2p", "optimizer", "other")
# The report's share column: these, as fractions of the step; exposed communication lies inside the phases.
TIME_SHARES = ("forward", "backward", "optimizer", "comm_exposed", "p2p")
PEAK = "memory/peak_gb"

# Marks in a row's "best" column, and what each one means.
BEST_MFU, BEST_PEAK, BEST_LOSS = "MFU", "peak", "loss"
BEST_MEANING = {BEST_MFU: "highest MFU", BEST_PEAK: "lowest peak memory", BEST_LOSS: "lowest final loss"}
MARKED_COLUMN = {
    BEST_MFU: "MFU %",
    BEST_PEAK: "peak GB",
    BEST_LOSS: "final loss",
}  # display column of each mark


@dataclass
class Row:
    """What the report shows of one cell; None where the cell did not record it."""

    cell_id: str
    label: str
    status: str
    error: str | None
    path: str
    model: str | None = None
    parallel: str | None = None
    zero_stage: int | None = None
    precision: str | None = None
    gpus: int | None = None
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    sp: int | None = None
    micro_size: int | None = None
    accum_steps: int | None = None
    global_size: int | None = None
    est_gb: dict[str, float] = field(default_factory=dict)  # TERMS and "total"
    measured_gb: dict[str, float] = field(default_factory=dict)  # TERMS
    residual_gb: dict[str, float] = field(default_factory=dict)  # measured, by name
    peak_gb: float | None = None
    planned_peak_gb: float | None = None  # plan=true's total for this layout, made at launch
    peak_is_host_rss: bool = False  # a CPU device: the peak is the process's high-water RSS
    planned_host_gb: float | None = None  # plan=true's host memory for one rank (process included)
    device_memory_gb: float | None = None
    tokens_per_s_per_device: float | None = None
    mfu: float | None = None
    step_spread: float | None = None  # the step times' IQR over their median, after the first step
    noisy: bool | None = None  # step_spread above runner/metrics/step_spread.py's NOISY_ABOVE
    time_s: dict[str, float] = field(default_factory=dict)  # "step", STEP_PHASES, "comm_exposed" -> seconds
    predicted_step_s: float | None = None  # the plan's step (summary.json's step_time, or plan.json)
    final_loss: float | None = None
    eval_loss: float | None = None  # the latest held-out loss (runner/train/evaluation.py), where evaluated
    steps: int | None = None
    best: list[str] = field(default_factory=list)
    layouts: str | None = None  # a run resumed onto another layout: each layout from its step
    wall: dict[str, Any] = field(
        default_factory=dict
    )  # summary.json's wall_time (runner/metrics/wall_clock.py)
    goodput: Mapping[str, Any] = field(
        default_factory=dict
    )  # summary.json's goodput (runner/metrics/goodput.py)

    def residual(self) -> float | None:
        """Measured memory beyond the four terms: the named residuals, else peak - measured terms."""
        if self.residual_gb:
            return sum(self.residual_gb.values())
        if self.peak_gb is not None:
            return max(self.peak_gb - sum(self.measured_gb.values()), 0.0)
        return None

    def time_share(self, name: str) -> float | None:
        """``name``'s seconds as a fraction of the step's (both medians over the steps after the first)."""
        seconds, step_s = self.time_s.get(name), self.time_s.get("step")
        return None if seconds is None or not step_s else seconds / step_s

    def flat(self) -> dict[str, Any]:
        """The row as one flat dict with units in the key names (for CSV and JSON)."""
        out: dict[str, Any] = {
            "cell": self.cell_id,
            "overrides": self.label,
            "status": self.status,
            "model": self.model,
            "parallel": self.parallel,
            "zero_stage": self.zero_stage,
            "precision": self.precision,
            "gpus": self.gpus,
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "sp": self.sp,
            "micro_size": self.micro_size,
            "accum_steps": self.accum_steps,
            "global_size": self.global_size,
        }
        for term in TERMS:
            out[f"est_{term}_gb"] = self.est_gb.get(term)
            out[f"measured_{term}_gb"] = self.measured_gb.get(term)
        out["est_total_gb"] = self.est_gb.get("total")
        out["measured_residual_gb"] = self.residual()
        out.update(
            {
                "peak_gb": self.peak_gb,
                "planned_peak_gb": self.planned_peak_gb,
                "device_memory_gb": self.device_memory_gb,
                "tokens_per_s_per_device": self.tokens_per_s_per_device,
                "mfu": self.mfu,
                "step_s": self.time_s.get("step"),
                "predicted_step_s": self.predicted_step_s,
                "step_iqr_over_median": self.step_spread,
                "noisy": self.noisy,
                **{f"time_{name}_pct": _percent(self.time_share(name)) for name in TIME_SHARES},
                "final_loss": self.final_loss,
                "eval_loss": self.eval_loss,
                "steps": self.steps,
                **{f"wall_{key}": self.wall.get(key) for key in WALL_FIELDS},
                "attempts": len(self.goodput.get("attempts") or []) or None,
                **{key: self.goodput.get(key) for key in GOODPUT_FIELDS},
                "best": ", ".join(self.best),
                "layouts": self.layouts,
                "error": self.error,
                "path": self.path,
            }
        )
        return out


def _percent(share: float | None) -> float | None:
    return None if share is None else 100 * share


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _integer(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _median_after_first(cell: Cell, key: str) -> float | None:
    values = [v for v in (_number(m.get(key)) for m in cell.metrics) if v is not None]
    if len(values) >= 2:
        return statistics.median(values[1:])
    return values[0] if values else None


def _time_seconds(cell: Cell) -> dict[str, float]:
    """Seconds per step of each phase and of exposed communication: medians over the steps after the first."""
    keys = {phase: f"time/{phase}_s" for phase in ("step", *STEP_PHASES, "comm_exposed")}
    seconds = {name: _median_after_first(cell, key) for name, key in keys.items()}
    return {name: value for name, value in seconds.items() if value is not None}


def _predicted_step(cell: Cell) -> float | None:
    """The plan's predicted step: summary.json's step_time (recorded at launch), else a planned
    cell's plan.json."""
    recorded = _number(_dict(cell.summary.step_time).get("predicted_s"))
    return _first(recorded, cell.plan.time.step_s if cell.plan is not None else None)


def _spread(cell: Cell) -> StepTimeSpread | None:
    """summary.json's step_time_spread, else the spread of the logged steps' times (an older run, or
    one that wrote no summary)."""
    recorded = cell.summary.step_time_spread
    if recorded is not None and _number(recorded.get("iqr_over_median")) is not None:
        return recorded
    return step_time_spread([v for m in cell.metrics if (v := _number(m.get("time/step_s"))) is not None])


def _last_logged(cell: Cell, key: str) -> float | None:
    return next((v for m in reversed(cell.metrics) if (v := _number(m.get(key))) is not None), None)


@dataclass(frozen=True)
class _Layout:
    gpus: int | None
    dp: int | None
    tp: int | None
    pp: int | None
    micro_size: int | None
    accum_steps: int | None
    global_size: int | None
    sp: int | None = 1  # a run from before sequence parallelism: 1


def _layout(cell: Cell) -> _Layout:
    """summary.json's layout record, or what the composed config says of it (DESIGN.md batch contract)."""
    recorded = cell.summary.layout
    if recorded is not None:
        keys = ("gpus", "dp", "tp", "pp", "micro_size", "accum_steps", "global_size", "sp")
        return _Layout(**{k: _integer(recorded.get(k, 1 if k == "sp" else None)) for k in keys})
    gpus = _integer(cell.config_value("gpus"))
    tp = _integer(cell.config_value("parallel.tp"))
    pp = _integer(cell.config_value("parallel.pp"))
    sp = _integer(cell.config_value("parallel.sp")) or 1  # a run from before sp: 1
    global_size = _integer(cell.config_value("batch.global_size"))
    micro = _integer(cell.config_value("batch.micro_size"))  # None when "auto"
    # dp = gpus / (tp * pp * sp); global = micro * accum * dp
    shared = tp * pp * sp if tp and pp else None
    dp = gpus // shared if gpus and shared and gpus % shared == 0 else None
    whole = global_size and micro and dp and global_size % (micro * dp) == 0
    accum = global_size // (micro * dp) if whole and global_size and micro and dp else None
    return _Layout(gpus, dp, tp, pp, micro, accum, global_size, sp=sp)


def _memory(cell: Cell, row: Row) -> None:
    """Memory terms from summary.json's memory record, else from the last logged step's metrics."""
    summary = cell.summary
    memory = _dict(summary.memory)
    estimated, measured = _dict(memory.get("estimated")), _dict(memory.get("measured"))
    for term in TERMS:
        est = _first(_number(estimated.get(f"{term}_gb")), _last_logged(cell, f"memory/est/{term}_gb"))
        if est is not None:
            row.est_gb[term] = est
        got = _first(_number(measured.get(f"{term}_gb")), _last_logged(cell, f"memory/measured/{term}_gb"))
        if got is not None:
            row.measured_gb[term] = got
    planned = cell.plan.memory_bytes if cell.plan is not None else None  # a plan=true cell: its terms
    if not row.est_gb and planned is not None:
        row.est_gb = {term: getattr(planned, term) / 1e9 for term in TERMS}
    complete = len(row.est_gb) == len(TERMS)
    total = _first(_number(estimated.get("total_gb")), sum(row.est_gb.values()) if complete else None)
    if total is not None:
        row.est_gb["total"] = total
    residual = _dict(measured.get("residual"))
    row.residual_gb = {str(k): gb for k, v in residual.items() if (gb := _number(v)) is not None}
    peaks = [v for v in (_number(m.get(PEAK)) for m in cell.metrics) if v is not None]
    row.peak_gb = _first(
        _number(measured.get("peak_gb")),
        _number(_dict(summary.final).get(PEAK)),
        max(peaks) if peaks else None,
    )
    row.device_memory_gb = _first(
        _number(memory.get("device_memory_gb")), _number(cell.config_value("cluster.device_memory_gb"))
    )
    row.planned_peak_gb = _number(_dict(summary.device_memory_plan).get("planned_peak_gb"))
    if row.planned_peak_gb is None and planned is not None and planned.peak:
        row.planned_peak_gb = planned.peak / 1e9  # a plan=true cell: its plan.json
    measure = summary.peak_memory_measure or ""
    row.peak_is_host_rss = measure.startswith(
        "process high-water RSS"
    )  # runner/hardware/peak_memory.py's label
    row.planned_host_gb = _number(_dict(summary.host_memory).get("planned_per_rank_gb"))


def row_of(cell: Cell, *, label: str = "") -> Row:
    """The report's row for one cell, from summary.json, then metrics.jsonl, then the config."""
    summary = cell.summary
    final = _dict(summary.final)

    def known(recorded: Any, config_key: str) -> Any:
        return recorded if recorded is not None else cell.config_value(config_key)

    def text(recorded: str | None, config_key: str) -> str | None:
        value = known(recorded, config_key)
        return str(value) if value is not None else None

    row = Row(
        cell_id=cell.cell_id,
        label=label,
        status=cell.status,
        error=cell.error,
        path=str(cell.run_dir),
        model=text(summary.model, "model.name"),
        parallel=text(summary.parallel, "parallel.name"),
        zero_stage=_integer(known(summary.zero_stage, "parallel.zero_stage")),
        precision=text(summary.precision, "precision.name"),
        **asdict(_layout(cell)),
    )
    _memory(cell, row)
    row.tokens_per_s_per_device = _first(
        _median_after_first(cell, TOKENS_PER_DEVICE), _number(final.get(TOKENS_PER_DEVICE))
    )
    row.mfu = _first(_median_after_first(cell, MFU), _number(final.get(MFU)))
    if (spread := _spread(cell)) is not None:
        row.step_spread, row.noisy = float(spread["iqr_over_median"]), bool(spread["noisy"])
    row.time_s = _time_seconds(cell)
    row.predicted_step_s = _predicted_step(cell)
    row.final_loss = _first(_number(final.get("loss")), _last_logged(cell, "loss"))
    row.eval_loss = _first(_number(_dict(summary.eval).get("loss")), _last_logged(cell, "eval/loss"))
    steps = summary.steps_completed
    row.steps = steps if steps is not None or not cell.metrics else len(cell.loss_curve())
    row.layouts = describe(summary.layout_history)
    row.wall = _dict(summary.wall_time)
    # From attempts.jsonl where it is there: it holds an attempt killed outright, which the
    # summary (written at an attempt's end) cannot.
    row.goodput = goodput.account(cell.run_dir) or _dict(summary.goodput)
    return row


def _sort_key(row: Row) -> list[tuple[int, int, str]]:
    """A sweep's cells by job number, as numbered directories sort (0, 1, ..., 10)."""
    return [natural_key(Path(p)) for p in Path(row.cell_id).parts]


def mark_best(rows: Sequence[Row]) -> None:
    """Mark, among completed cells, the highest MFU, the lowest peak memory and the lowest final loss.

    Values are compared as displayed: cells that show the same number tie, and when every cell
    ties (loss curves that coincide, say) nothing is marked.
    """
    done = [r for r in rows if r.status == RunStatus.completed]
    criteria: list[tuple[str, Callable[[Row], float | None], bool]] = [
        (BEST_MFU, lambda r: r.mfu, True),
        (BEST_PEAK, lambda r: r.peak_gb, False),
        (BEST_LOSS, lambda r: r.final_loss, False),
    ]
    for mark, value, higher in criteria:
        show = next(c.show for c in DISPLAY_COLUMNS if c.header == MARKED_COLUMN[mark])
        known = sorted(((v, r) for r in done if (v := value(r)) is not None), key=lambda pair: pair[0])
        if len(known) < 2 or show(known[0][1]) == show(known[-1][1]):
            continue  # "best" of one cell, or of cells that all show the same value, says nothing
        best = show((known[-1] if higher else known[0])[1])
        for _, row in known:
            if show(row) == best:
                row.best.append(mark)


def build_rows(cells: Sequence[Cell]) -> list[Row]:
    """Rows of every cell (failed and unfinished too), in job-number order; the best marked."""
    labels = distinguishing_overrides(cells)
    rows = [row_of(c, label=labels.get(c.cell_id, "")) for c in cells]
    rows.sort(key=_sort_key)
    mark_best(rows)
    return rows


# -- display: the same strings in the terminal, Markdown and the HTML table ------------------


def fmt_gb(value: float | None) -> str:
    """GB with about three significant figures; an en dash when unknown."""
    if value is None:
        return "–"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _fmt(value: float | int | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _dims(row: Row) -> str:
    return "·".join(_fmt(v, "d") for v in (row.dp, row.tp, row.pp, row.sp))


def _time_shares(row: Row) -> str:
    shares = [row.time_share(name) for name in TIME_SHARES]
    if all(share is None for share in shares):
        return "–"
    return " / ".join("–" if share is None else f"{100 * share:.0f}" for share in shares)


def _term(term: str) -> Callable[[Row], str]:
    def show(row: Row) -> str:
        return f"{fmt_gb(row.est_gb.get(term))} / {fmt_gb(row.measured_gb.get(term))}"

    return show


@dataclass(frozen=True)
class Column:
    """A displayed column: header (with unit), how to show a row, whether it is numeric, and for a
    page with two header rows, the group it belongs to and its header under that group."""

    header: str
    show: Callable[[Row], str]
    numeric: bool = True
    group: str = ""
    short: str = ""


MEMORY_GROUP = "memory per device, GB: estimated / measured"
STEP_GROUP = "step s"  # on the page: the measured and the predicted step under one header
# summary.json's wall_time fields the flat row (CSV, JSON) carries, as wall_<field>.
WALL_FIELDS = (
    "total_s",
    "steps_share",
    "launch_s",
    "build_s",
    "engine_s",
    "resume_s",
    "setup_s",
    "steps_s",
    "checkpoint_s",
    "checkpoints",
    "checkpoint_gb",
    "checkpoint_gb_per_s",
    "eval_s",
    "evaluations",
    "other_s",
)

# summary.json's goodput fields (runner/metrics/goodput.py: every attempt of the run) the flat row carries.
GOODPUT_FIELDS = ("goodput", "goodput_elapsed", "steps_lost", "lost_s", "between_attempts_s", "conversion_s")


def _spread_shown(row: Row) -> str:
    """``8``, or ``31 noisy`` above the threshold: the step times' IQR as a % of their median."""
    if row.step_spread is None:
        return "–"
    return f"{100 * row.step_spread:.0f}" + (" noisy" if row.noisy else "")


def _wall_and_steps(row: Row) -> str:
    total, share = _number(row.wall.get("total_s")), _number(row.wall.get("steps_share"))
    if total is None:
        return "–"
    return f"{total:,.1f}" + (f" ({100 * share:.0f}%)" if share is not None else "")


DISPLAY_COLUMNS: tuple[Column, ...] = (
    Column("cell", lambda r: r.cell_id, numeric=False),
    Column("overrides", lambda r: r.label, numeric=False),
    Column("parallel", lambda r: r.parallel or "–", numeric=False),
    Column("gpus", lambda r: _fmt(r.gpus, "d")),
    Column("dp·tp·pp·sp", _dims),
    Column("micro", lambda r: _fmt(r.micro_size, "d")),
    Column("accum", lambda r: _fmt(r.accum_steps, "d")),
    Column("global", lambda r: _fmt(r.global_size, "d")),
    *(Column(f"{term} GB est / meas", _term(term), group=MEMORY_GROUP, short=term) for term in TERMS),
    Column("peak GB", lambda r: fmt_gb(r.peak_gb), group=MEMORY_GROUP, short="peak"),
    Column("device GB", lambda r: fmt_gb(r.device_memory_gb), group=MEMORY_GROUP, short="device"),
    Column("tokens/s/device", lambda r: _fmt(r.tokens_per_s_per_device, ",.0f")),
    Column("MFU %", lambda r: _fmt(None if r.mfu is None else 100 * r.mfu, ".1f")),
    Column("step s", lambda r: _fmt(r.time_s.get("step"), ".3g"), group=STEP_GROUP, short="meas"),
    Column("pred step s", lambda r: _fmt(r.predicted_step_s, ".3g"), group=STEP_GROUP, short="pred"),
    Column("step IQR %", _spread_shown),
    Column("step % fwd / bwd / opt / comm / p2p", _time_shares, numeric=False),
    Column("final loss", lambda r: _fmt(r.final_loss, ".4f")),
    Column("eval loss", lambda r: _fmt(r.eval_loss, ".4f")),
    Column("wall s (steps %)", _wall_and_steps),
    Column("status", lambda r: r.status, numeric=False),
    Column("best", lambda r: ", ".join(r.best), numeric=False),
)

# What each display column means, one line each: the terminal's legend lists those of its table.
COLUMN_MEANINGS: dict[str, str] = {
    "GB": "GB = 1e9 bytes; memory per term: estimated / measured (– where not recorded)",
    "peak GB": "the measured peak: CUDA's max_memory_allocated, on a CPU the high-water RSS",
    "tokens/s/device": "tokens/s per device, the median over the logged steps after the first",
    "MFU %": "model FLOP/s per device over its peak FLOP/s, the same median",
    "step s": "the measured step time (same median)",
    "pred step s": "the plan's calibrated prediction (summary.json's step_time, with its error)",
    "step IQR %": f"the step times' IQR over their median; noisy above {100 * NOISY_ABOVE:.0f}%: "
    "another process shared the cores",
    "step % fwd / bwd / opt / comm / p2p": "each phase's share of the step; comm: exposed communication",
    "wall s (steps %)": "the latest attempt's wall time from the command's start; the steps' share",
    "best": "the completed cells with the highest MFU, the lowest peak memory, the lowest final loss",
}
UNITS_NOTE = (
    "; ".join(
        f"{header}: {meaning}" if header != "GB" else meaning for header, meaning in COLUMN_MEANINGS.items()
    )
    + "."
)
