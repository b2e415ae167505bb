"""A resume that is refused leaves the run's ``.hydra/`` files as they were.

Hydra writes ``.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` into the run
directory before the task starts, and ladder's checks (a resume onto another global batch,
say) run in the task. Entering a directory that already holds a run (``train.resume=auto``,
a requeued job), the launching process first copies those files aside
(:func:`set_aside`, from the Hydra callback); a refusal puts them back (:func:`put_back`),
and an attempt that starts drops the copy (:func:`drop_copy`): ``.hydra/`` is the config of
the latest attempt that ran, which is what the ranks read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HYDRA_DIR = ".hydra"
ASIDE = ".before-this-attempt"


def _aside(run_dir: Path) -> Path:
    return run_dir / HYDRA_DIR / ASIDE


def set_aside(run_dir: Path) -> None:
    """Copy the run's current ``.hydra/*.yaml`` aside, before Hydra writes this attempt's."""
    files = sorted((run_dir / HYDRA_DIR).glob("*.yaml"))
    if not files:
        return
    aside = _aside(run_dir)
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir()
    for path in files:
        shutil.copy2(path, aside / path.name)


def put_back(run_dir: Path) -> bool:
    """Restore the files set aside (this attempt was refused). True if there were any."""
    aside = _aside(run_dir)
    if not aside.is_dir():
        return False
    for path in (run_dir / HYDRA_DIR).glob("*.yaml"):
        if not (aside / path.name).exists():
            path.unlink()  # written by this attempt only
    for path in aside.iterdir():
        shutil.copy2(path, run_dir / HYDRA_DIR / path.name)
    shutil.rmtree(aside)
    return True


def drop_copy(run_dir: Path) -> None:
    """This attempt starts: its ``.hydra/`` files are the run's record now."""
    shutil.rmtree(_aside(run_dir), ignore_errors=True)
