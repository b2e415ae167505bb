"""A resume that is refused leaves the run's (or the sweep's) Hydra files as they were.

Hydra writes ``.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` into the run
directory before the task starts (and a sweep's ``multirun.yaml`` into the sweep directory
before its first cell), and ladder's checks (a resume onto another global batch, say) run
in the task. Entering a directory that already holds a run (``train.resume=auto``, a
requeued job), the launching process first copies those files aside (:func:`set_aside`,
:func:`set_aside_sweep`, from the Hydra callback); a refusal puts them back
(:func:`put_back`), and an attempt that runs drops the copy (:func:`attempt_ran`):
``.hydra/`` is the config of the latest attempt that ran, which is what the ranks read.

In a sweep every existing cell is set aside at its start, as Hydra writes a cell's files
only when it reaches the cell. When the sweep ends (or stops at a refused cell),
:func:`put_back_sweep` restores what no attempt replaced: the cells this sweep did not
run, and ``multirun.yaml`` when none of its cells ran.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from runner.rundir.run_files import (
    DEEPSPEED_CONFIG_FILE,
    EARLIER_ATTEMPTS_DIR,
    FAILURE_FILES,
    HYDRA_DIR,
    HYDRA_RUN_FILES,
    METRICS_FILE,
    MULTIRUN_FILE,
    PROFILE_DIR,
    SET_ASIDE_DIR,
    SUMMARY_FILE,
)

SWEEP_FILES = (MULTIRUN_FILE,)  # in the sweep directory


def _set_aside(folder: Path, names: tuple[str, ...]) -> None:
    files = [folder / name for name in names if (folder / name).is_file()]
    if not files:
        return
    aside = folder / SET_ASIDE_DIR
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir()
    for path in files:
        shutil.copy2(path, aside / path.name)


def _put_back(folder: Path, names: tuple[str, ...]) -> bool:
    aside = folder / SET_ASIDE_DIR
    if not aside.is_dir():
        return False
    for name in names:
        if (folder / name).is_file() and not (aside / name).exists():
            (folder / name).unlink()  # written by this attempt only
    for path in aside.iterdir():
        shutil.copy2(path, folder / path.name)
    shutil.rmtree(aside)
    return True


def set_aside(run_dir: Path) -> None:
    """Copy the run's current ``.hydra/*.yaml`` aside, before Hydra writes this attempt's."""
    _set_aside(run_dir / HYDRA_DIR, HYDRA_RUN_FILES)


def put_back(run_dir: Path) -> bool:
    """Restore the files set aside (this attempt was refused). True if there were any."""
    return _put_back(run_dir / HYDRA_DIR, HYDRA_RUN_FILES)


def drop_copy(run_dir: Path) -> None:
    """This attempt ran: its ``.hydra/`` files are the run's record now."""
    shutil.rmtree(run_dir / HYDRA_DIR / SET_ASIDE_DIR, ignore_errors=True)


def _cells(sweep_dir: Path) -> list[Path]:
    """The sweep's cells that hold Hydra files (``hydra.sweep.subdir`` may nest them), not the
    copies kept with an earlier attempt of a cell (keep_earlier_attempt below)."""
    return sorted(
        hydra.parent
        for hydra in sweep_dir.rglob(HYDRA_DIR)
        if hydra.is_dir() and EARLIER_ATTEMPTS_DIR not in hydra.relative_to(sweep_dir).parts
    )


def set_aside_sweep(sweep_dir: Path) -> None:
    """A resumed sweep: set aside ``multirun.yaml`` and every existing cell's files."""
    _set_aside(sweep_dir, SWEEP_FILES)
    for cell in _cells(sweep_dir):
        set_aside(cell)


def attempt_ran(run_dir: Path, sweep_dir: Path | None) -> None:
    """This attempt (a run, or a cell of ``sweep_dir``) ran: drop its copies, and the sweep's."""
    drop_copy(run_dir)
    if sweep_dir is not None:
        shutil.rmtree(sweep_dir / SET_ASIDE_DIR, ignore_errors=True)


def put_back_sweep(sweep_dir: Path) -> None:
    """The sweep is over: restore whatever is still set aside (no attempt of it replaced that)."""
    for cell in _cells(sweep_dir):
        put_back(cell)
    _put_back(sweep_dir, SWEEP_FILES)


# Sweep directories that did not exist when the sweep began (this process's sweeps).
_NEW_SWEEP_DIRS: set[Path] = set()


def note_new_sweep_dir(sweep_dir: Path) -> None:
    """Before Hydra creates it: the sweep's directory is this sweep's own, if it does not exist."""
    if not sweep_dir.exists():
        _NEW_SWEEP_DIRS.add(sweep_dir.resolve())


def remove_refused_sweep_dir(sweep_dir: Path) -> bool:
    """A sweep refused before any cell ran: remove the directory it created for nothing.

    Only a directory this sweep created (``note_new_sweep_dir``), and only the ``multirun.yaml``
    Hydra wrote into it before the launcher refused; it stays if anything else is there.
    Returns whether it was removed.
    """
    if sweep_dir.resolve() not in _NEW_SWEEP_DIRS:
        return False
    if sweep_dir.is_dir() and any(path.name not in SWEEP_FILES for path in sweep_dir.iterdir()):
        return False  # a cell of it is there: its multirun.yaml stays with it
    for name in SWEEP_FILES:
        (sweep_dir / name).unlink(missing_ok=True)
    try:
        sweep_dir.rmdir()
    except OSError:  # something else was written there: leave it
        return False
    return True


# Run directories that did not exist when this process began its run, each with the first of
# its parents that did not exist either (outputs/<date>/ on a day's first run): made by it.
_NEW_RUN_DIRS: dict[Path, Path] = {}


def note_new_run_dir(run_dir: Path) -> None:
    """Before Hydra creates it: the run directory is this run's own, if it does not exist."""
    run_dir = run_dir.resolve()
    if run_dir.exists():
        return
    top = run_dir
    while not top.parent.exists():
        top = top.parent
    _NEW_RUN_DIRS[run_dir] = top


def _made_here(run_dir: Path) -> Path | None:
    """The highest folder this process made for ``run_dir``: noted by the run, or a cell's own
    folder in a sweep directory the sweep made; None when the directory was there before."""
    if run_dir in _NEW_RUN_DIRS:
        return _NEW_RUN_DIRS[run_dir]
    for sweep_dir in _NEW_SWEEP_DIRS:
        if run_dir != sweep_dir and run_dir.is_relative_to(sweep_dir):
            return sweep_dir / run_dir.relative_to(sweep_dir).parts[0]
    return None


def made_by_this_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` did not exist before this process began its run (or its sweep)."""
    return _made_here(run_dir.resolve()) is not None


def remove_refused_run_dir(run_dir: Path) -> bool:
    """A run refused before launch: remove the directory this process made for it.

    Only a directory that did not exist before (:func:`note_new_run_dir`, or a cell of a new
    sweep), only the files Hydra wrote into it (``.hydra/``, the job's log), and the parents
    made with it; each stays if anything else is there. Returns whether it was removed.
    """
    run_dir = run_dir.resolve()
    top = _made_here(run_dir)
    if top is None or not run_dir.is_dir():
        return False
    for name in HYDRA_RUN_FILES:
        (run_dir / HYDRA_DIR / name).unlink(missing_ok=True)
    for log in run_dir.glob("*.log"):  # Hydra's job log (train.log), of this refused run only
        log.unlink()
    _remove_if_empty(run_dir / HYDRA_DIR)
    folder = run_dir
    while _remove_if_empty(folder) and folder != top:
        folder = folder.parent
    return not run_dir.exists()


def _remove_if_empty(folder: Path) -> bool:
    try:
        folder.rmdir()
    except OSError:  # not empty (something else was written there: it stays), or not there
        return False
    return True


# What an attempt leaves in its run directory, besides checkpoints (none, when it starts
# over), Hydra's train.log (appended to) and wandb/ (one folder per wandb run).
ATTEMPT_FILES = (METRICS_FILE, SUMMARY_FILE, DEEPSPEED_CONFIG_FILE, PROFILE_DIR)


def keep_earlier_attempt(run_dir: Path) -> Path | None:
    """Move an earlier attempt's results to ``earlier_attempts/<n>/`` before this one starts over.

    ``train.resume=auto`` (or a requeued job) with no checkpoint to continue from trains from
    step 0 in the same directory: the earlier attempt's metrics, summary, DeepSpeed config,
    failure records and profile move aside with the Hydra config it ran with (set aside by
    below), so a finished run resumed by mistake is not replaced. Returns the
    folder, or None when there was nothing to keep.
    """
    found = [run_dir / name for name in ATTEMPT_FILES if (run_dir / name).exists()]
    found += sorted(run_dir.glob(FAILURE_FILES))
    if not found:
        return None
    earlier = run_dir / EARLIER_ATTEMPTS_DIR
    number = 1 + sum(1 for path in earlier.iterdir() if path.is_dir()) if earlier.is_dir() else 1
    folder = earlier / str(number)
    folder.mkdir(parents=True)
    for path in found:
        path.rename(folder / path.name)
    hydra = run_dir / HYDRA_DIR / SET_ASIDE_DIR
    if hydra.is_dir():
        shutil.copytree(hydra, folder / HYDRA_DIR)
    return folder
