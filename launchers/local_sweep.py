"""A sweep on this host (hydra_plugins/ladder_local): every cell checked before the first trains.

Each cell is composed as Hydra will compose it for its job, and run through the checks
``python train.py`` makes before any rank starts (``launchers.prelaunch.local_launch_problems``:
config values, the batch contract, this host's ranks and RAM, ``micro_size=auto``'s fit).
A problem refuses the sweep with every cell it concerns, as a SLURM sweep refuses before
it submits (launchers/slurm/launcher.py). What only a cell's own run directory can tell (a resume
onto another global batch, say) is still found when the cell starts.

After the cells ran, each cell that failed is named with its error: a failed rank no longer
stops the cells after it (the others' results stay comparable in ``ladder report``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import OmegaConf

from launchers.cell_config import task_config
from launchers.compose import to_train_config
from launchers.prelaunch import local_launch_problems
from runner.checkpoint.size import sweep_disk_problem
from runner.config import Resume, TrainConfig


def _labels(job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[str]:
    """Each cell as ``#<num> (<its overrides>)``, naming only the overrides that differ between cells."""
    cells = [filter_overrides(list(overrides)) for overrides in job_overrides]
    common = set.intersection(*(set(cell) for cell in cells)) if len(cells) > 1 else set()
    return [
        f"#{initial_job_idx + offset} ({' '.join(o for o in cell if o not in common) or 'defaults'})"
        for offset, cell in enumerate(cells)
    ]


def cell_problems(launcher: Any, overrides: Sequence[str]) -> tuple[TrainConfig | None, list[str]]:
    """This cell's config, composed as its job will be, and what would refuse it before its ranks
    start (no config: it did not compose)."""

    try:
        cell_cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
        config = to_train_config(task_config(cell_cfg))
    except Exception as error:  # a composition error: the cell's override names a bad key or value
        return None, [" ".join(str(error).split())]
    return config, local_launch_problems(config)


def cells_refusal(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> str | None:
    """Every problem of the sweep's cells, each with the cells it concerns; None when all can start.

    A sweep of plans (``plan=true`` or ``planner.recommend=true`` for every cell) is not checked
    ahead: a plan costs no more than the check, and each cell's plan says what is wrong.
    """
    config = launcher.config
    if any(OmegaConf.select(config, key) is True for key in ("plan", "planner.recommend", "planner.max_seq")):
        return None
    found: dict[str, list[str]] = {}
    fresh: list[TrainConfig] = []  # the cells that start over: a resumed cell checks its own disk
    for overrides, label in zip(job_overrides, _labels(job_overrides, initial_job_idx), strict=True):
        cell, problems = cell_problems(launcher, overrides)
        for problem in problems:
            found.setdefault(problem, []).append(label)
        if cell is not None and not problems and cell.train.resume == Resume.never:
            fresh.append(cell)
    if not found and (disk := sweep_disk_problem(fresh, Path(str(config.hydra.sweep.dir)))) is not None:
        found[disk] = ["all of them"]
    if not found:
        return None
    lines = [f"  - {problem}\n      cells: {', '.join(labels)}" for problem, labels in found.items()]
    return "no cell was started:\n" + "\n".join(lines)


# The cells of this process's sweep that failed, as name_failed_cells reported them; train.py
# exits 1 after Hydra is done when there are any (Hydra's sweep itself ends normally, so its
# end-of-sweep callbacks run).
FAILED_CELLS: list[str] = []


def name_failed_cells(
    results: Sequence[JobReturn],
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    sweep_dir: Path,
) -> Sequence[JobReturn]:
    """Name each failed cell and its error on stderr, and hand Hydra's sweeper the cells as done.

    Hydra's sweeper raises the first failed result, which would end the sweep with Hydra's
    own words; the failures are in FAILED_CELLS instead, for train.py's exit status.
    """
    labels = _labels(job_overrides, initial_job_idx)
    failed = []
    for result, label in zip(results, labels, strict=True):
        if result.status == JobStatus.FAILED:  # _return_value: the property would print and raise
            failed.append(f"{label}: {result._return_value}")
            result.status, result.return_value = JobStatus.COMPLETED, None
    if failed:
        lines = [f"ladder: {len(failed)} of {len(results)} cells failed:", *(f"  {f}" for f in failed)]
        lines.append(f"  compare the cells that completed: ladder report {sweep_dir}")
        print("\n".join(lines), file=sys.stderr, flush=True)
        FAILED_CELLS.extend(failed)
    return results
