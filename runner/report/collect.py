"""Find the run directories under the paths a user names, and read what each one left.

A run directory is Hydra's output directory of one cell. Any of its files may be missing
(a cell refused before launch, crashed, still running, or never started): a cell is read
with what is known and never dropped.

    .hydra/config.yaml      the composed config          .hydra/overrides.yaml  the cell's overrides
    summary.json            status, layout, final metrics, memory (runner/rundir/summary.py writes it)
    metrics.jsonl           one JSON object per logged step
    failure_rank<N>.json    a failed rank's error (runner/rundir/run_files.py writes it)
    plan.json               what plan=true planned, where nothing was launched (runner/plan/planner.py)

A multirun directory holds cells as numbered subdirectories plus ``multirun.yaml``; cells that
``multirun.yaml`` expects but whose directory is absent are listed as ``missing``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runner.rundir.metrics_file import read_records
from runner.rundir.plan_record import PlanFileError, PlannedTime, PlanRecord, load_plan
from runner.rundir.run_files import (
    DEEPSPEED_CONFIG_FILE,
    FAILURE_FILES,
    HYDRA_CONFIG_FILE,
    HYDRA_DIR,
    HYDRA_OVERRIDES_FILE,
    METRICS_FILE,
    MULTIRUN_FILE,
    PLAN_FILE,
    SUMMARY_FILE,
)
from runner.rundir.summary import RunStatus, RunSummary, SummaryError, load_summary

CONFIG_FILE = Path(HYDRA_DIR) / HYDRA_CONFIG_FILE
OVERRIDES_FILE = Path(HYDRA_DIR) / HYDRA_OVERRIDES_FILE
RUN_MARKERS = (SUMMARY_FILE, METRICS_FILE, str(CONFIG_FILE), DEEPSPEED_CONFIG_FILE, PLAN_FILE)

# How deep below a named path to look for run directories: multirun/<date>/<time>/<cell>.
MAX_DEPTH = 4


class ReportInputError(Exception):
    """A path given to the report does not exist or holds no run directory."""


@dataclass(frozen=True)
class Cell:
    """Everything one run directory holds, as plain data; any part may be empty."""

    run_dir: Path
    cell_id: str
    summary: RunSummary = field(default_factory=RunSummary)  # every key None where none was written
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    missing: bool = False
    plan: PlanRecord | None = None  # plan.json: a plan=true cell's plan
    plan_error: str | None = None  # why plan.json was skipped (not JSON, a key of the wrong type)
    summary_error: str | None = None  # why summary.json was skipped (not JSON, a key of the wrong type)

    @property
    def status(self) -> str:
        """completed, failed, running, interrupted (as summary.json says), planned (plan=true:
        plan.json, nothing launched), unfinished (no summary), unreadable (summary.json skipped)
        or missing."""
        if self.missing:
            return "missing"
        if self.summary_error is not None:
            return "unreadable"
        if self.summary.status:
            return self.summary.status
        if self.failures:
            return RunStatus.failed
        if self.plan_error is not None and not self.metrics:
            return "unreadable"
        return "planned" if self.plan is not None and not self.metrics else "unfinished"

    @property
    def error(self) -> str | None:
        """Why the cell did not complete, in one line; None for a completed cell."""
        if self.status == RunStatus.completed:
            return None
        if self.summary_error is not None:
            return self.summary_error
        if self.status == "unreadable" and self.plan_error is not None:
            return self.plan_error
        error, rank = self.summary.error, self.summary.failed_rank
        if error:
            return f"rank {rank}: {error}" if rank is not None else error
        if self.failures:
            first = self.failures[0]
            return f"rank {first.get('rank')}: {first.get('error')}"
        if self.missing:
            return "no run directory: the cell never started (multirun.yaml expects it)"
        if self.status == "planned" and self.plan is not None:
            return _plan_words(self.plan)
        steps = [int(m["step"]) for m in self.metrics if isinstance(m.get("step"), int | float)]
        if self.status == RunStatus.running:
            last = f"; last logged step {max(steps) + 1}" if steps else ""  # counted from 1, as the console
            return f"summary.json says running: still running, or killed{last}"
        if steps:
            step = max(steps) + 1
            return f"no summary.json: stopped after logging step {step} (crashed, killed or running)"
        return "no summary.json and no metrics: refused before launch, crashed before step 0, or not started"

    def config_value(self, dotted: str) -> Any:
        """A value of the composed config by dotted key (``batch.global_size``), or None."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def loss_curve(self, metric: str = "loss") -> dict[int, float]:
        """Loss (or ``metric``, e.g. the held-out ``eval/loss``) by step, from metrics.jsonl (later
        records win when a step repeats)."""
        curve: dict[int, float] = {}
        for record in self.metrics:
            step, loss = record.get("step"), record.get(metric)
            if isinstance(step, int | float) and isinstance(loss, int | float):
                curve[int(step)] = float(loss)
        return curve


def _plan_words(plan: PlanRecord) -> str:
    """A plan=true cell's verdict in one line, from its plan.json."""
    words = ["plan=true: nothing launched"]
    verdict = "FITS" if plan.fits else "DOES NOT FIT"
    words.append(f"planned peak {plan.memory_bytes.peak / 1e9:.3g} GB per device ({verdict})")
    words += _time_words(plan.time)
    if plan.batch_contract_error:
        words.append(f"batch contract NOT met: {plan.batch_contract_error}")
    return "; ".join(words)


def _time_words(time: PlannedTime) -> list[str]:
    """plan.json's step: the calibrated prediction and, beside it, the roofline bound; the bound
    alone where the plan had no calibration (its step_s is then the bound's)."""
    step_s, mfu = time.step_s, time.mfu
    if step_s is None or mfu is None:
        return []
    at_least, at_most = (">= ", "<= ") if time.step_s_is_lower_bound else ("", "")
    if not time.calibration:
        return [f"bound (compute at peak): step {at_least}{step_s:.3g} s, MFU <= {100 * mfu:.1f}%"]
    words = [f"predicted step {at_least}{step_s:.3g} s, MFU {at_most}{100 * mfu:.1f}%"]
    if time.bound_step_s is not None and time.bound_mfu is not None:
        words.append(
            f"bound (compute at peak): step {time.bound_step_s:.3g} s, MFU <= {100 * time.bound_mfu:.1f}%"
        )
    return words


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run directory: it holds one of the files a run leaves."""
    return any((path / marker).exists() for marker in RUN_MARKERS)


def natural_key(path: Path) -> tuple[int, int, str]:
    """Sort key: numbered cells in numeric order (0, 1, ..., 10), then other names alphabetically."""
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)


def find_run_dirs(root: Path, *, depth: int = MAX_DEPTH) -> list[Path]:
    """Run directories at or below ``root`` (not below a run directory), cells in numeric order."""
    if is_run_dir(root):
        return [root]
    if depth == 0 or not root.is_dir():
        return []
    found: list[Path] = []
    children = [c for c in root.iterdir() if c.is_dir() and not c.name.startswith(".")]
    for child in sorted(children, key=natural_key):
        found.extend(find_run_dirs(child, depth=depth - 1))
    return found


def _read_json(path: Path, problems: list[str]) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        problems.append(f"{path.name} unreadable: {error}")
        return {}
    return data if isinstance(data, dict) else {}


def _read_plan(run_dir: Path) -> tuple[PlanRecord | None, str | None]:
    """The cell's plan.json through its schema (None when there is none), or why it was skipped."""
    try:
        return load_plan(run_dir), None
    except (OSError, PlanFileError) as error:
        return None, f"{run_dir / PLAN_FILE}: unreadable ({error})"


def _read_yaml(path: Path, problems: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        problems.append(f"{path} unreadable: {error}")
        return None


def _read_metrics(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    records, bad = read_records(path)
    if bad:
        problems.append(f"{METRICS_FILE}: skipped {bad} unreadable line(s)")
    return records


def _read_summary(run_dir: Path, problems: list[str]) -> tuple[RunSummary, str | None]:
    """summary.json through its schema (runner/rundir/summary.py), upgraded from an older one;
    a malformed one is skipped, and why is returned and kept among the cell's problems."""
    try:
        summary = load_summary(run_dir)
    except SummaryError as error:
        problems.append(f"{SUMMARY_FILE} skipped: {error}")
        return RunSummary(), str(error)
    except OSError as error:
        problems.append(f"{SUMMARY_FILE} skipped: {error}")
        return RunSummary(), f"{run_dir / SUMMARY_FILE}: unreadable ({error})"
    return (RunSummary() if summary is None else summary), None


def read_cell(run_dir: Path, *, cell_id: str) -> Cell:
    """Read one run directory; files that are absent or unreadable leave their part empty."""
    problems: list[str] = []
    summary, summary_error = _read_summary(run_dir, problems)
    config = _read_yaml(run_dir / CONFIG_FILE, problems)
    overrides = _read_yaml(run_dir / OVERRIDES_FILE, problems)
    failures = [_read_json(p, problems) for p in sorted(run_dir.glob(FAILURE_FILES))]
    failures.sort(key=lambda f: int(f["rank"]) if isinstance(f.get("rank"), int) else 1 << 30)
    plan, plan_error = _read_plan(run_dir)
    return Cell(
        run_dir=run_dir,
        cell_id=cell_id,
        summary=summary,
        summary_error=summary_error,
        metrics=_read_metrics(run_dir / METRICS_FILE, problems),
        config=config if isinstance(config, dict) else {},
        overrides=[str(o) for o in overrides] if isinstance(overrides, list) else [],
        failures=failures,
        problems=problems,
        plan=plan,
        plan_error=plan_error,
    )


def expected_sweep(multirun: dict[str, Any]) -> list[list[str]] | None:
    """Each job's overrides, in job-number order, as Hydra's BasicSweeper enumerates them.

    Mirrors hydra/_internal/core_plugins/basic_sweeper.py (``split_arguments``): the product of
    the sweep lists, keyed in the order the overrides were given, ``hydra.sweeper.params`` first.
    None when the sweep cannot be enumerated that way (another sweeper, a custom subdir).
    """
    hydra_node = multirun.get("hydra") or {}
    sweeper = hydra_node.get("sweeper") or {}
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    if str((hydra_node.get("sweep") or {}).get("subdir", "")) != "${hydra.job.num}":
        return None
    params = sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += list((hydra_node.get("overrides") or {}).get("task") or [])
    try:
        # deferred: only a sweep with missing cells parses its overrides, with Hydra's own grammar
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(arguments)
        choices: dict[str, list[str]] = {}
        for override in parsed:
            key = override.get_key_element()
            if override.is_sweep_override():
                if not override.is_discrete_sweep():
                    return None
                choices[key] = [f"{key}={v}" for v in override.sweep_string_iterator()]
            else:
                choices[key] = [f"{key}={override.get_value_element_as_str()}"]
    except Exception:  # an override this Hydra cannot parse: do not guess the sweep
        return None
    return [list(job) for job in itertools.product(*choices.values())]


def _missing_cells(sweep_dir: Path, found: set[Path], problems: list[str]) -> list[tuple[Path, list[str]]]:
    multirun = _read_yaml(sweep_dir / MULTIRUN_FILE, problems)
    jobs = expected_sweep(multirun) if isinstance(multirun, dict) else None
    if jobs is None:
        return []
    return [(sweep_dir / str(n), job) for n, job in enumerate(jobs) if (sweep_dir / str(n)) not in found]


def _common_parent(dirs: Sequence[Path]) -> Path:
    if len(dirs) == 1:
        return dirs[0].parent
    return Path(os.path.commonpath([str(d) for d in dirs]))


def collect(paths: Iterable[Path]) -> list[Cell]:
    """Every cell under the given paths, once each, including cells a sweep expects but lacks."""
    run_dirs: list[Path] = []
    missing: list[tuple[Path, list[str]]] = []
    problems: list[str] = []
    for raw in paths:
        path = Path(raw).resolve()
        if not path.exists():
            raise ReportInputError(f"no such file or directory: {raw}")
        found = find_run_dirs(path)
        sweep_dirs = sorted({d.parent for d in found if (d.parent / MULTIRUN_FILE).exists()})
        if (path / MULTIRUN_FILE).exists() and path not in sweep_dirs:
            sweep_dirs.append(path)  # a sweep whose every cell is missing
        for sweep_dir in sweep_dirs:
            known = {d for d, _ in missing}
            missing.extend(m for m in _missing_cells(sweep_dir, set(found), problems) if m[0] not in known)
        if not found and not missing:
            raise ReportInputError(
                f"{raw} holds no run directory (none of {', '.join(RUN_MARKERS)} at or below it)"
            )
        run_dirs.extend(d for d in found if d not in run_dirs)
    everything = run_dirs + [d for d, _ in missing]
    base = _common_parent(everything)

    def cell_id(run_dir: Path) -> str:
        return str(run_dir.relative_to(base)) if run_dir != base else run_dir.name

    cells = [read_cell(d, cell_id=cell_id(d)) for d in run_dirs]
    cells += [Cell(run_dir=d, cell_id=cell_id(d), overrides=o, missing=True) for d, o in missing]
    return sorted(cells, key=lambda c: [natural_key(Path(p)) for p in Path(c.cell_id).parts])


def distinguishing_overrides(cells: Sequence[Cell]) -> dict[str, str]:
    """Each cell's overrides less those every cell shares: a short label such as ``gpus=2 parallel=zero3``."""
    shared = set.intersection(*(set(c.overrides) for c in cells)) if cells else set()
    labels = {}
    for cell in cells:
        own = [o for o in cell.overrides if o not in shared or len(cells) == 1]
        labels[cell.cell_id] = " ".join(own)
    return labels
