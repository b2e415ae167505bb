"""Hydra callbacks: refuse to reuse a directory that already holds a run, before Hydra writes to it.

Hydra saves ``.hydra/config.yaml`` into the run directory before the task starts, so
the check has to run earlier, in ``on_run_start`` / ``on_multirun_start``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.summary import SUMMARY_FILE

RESUME_ENV = "LADDER_RESUME"  # set by a resumed (requeued) job that must re-enter its directory


def _held_runs(directory: Path) -> list[Path]:
    if (directory / SUMMARY_FILE).exists():
        return [directory]
    if not directory.is_dir():
        return []
    return sorted(p.parent for p in directory.glob(f"*/{SUMMARY_FILE}"))


class ProtectRunDirs(Callback):
    """Refuse an output directory that already holds a finished or running run."""

    def _check(self, key: str, directory: str) -> None:
        if os.environ.get(RESUME_ENV):
            return
        held = _held_runs(Path(directory))
        if held:
            print(
                f"ladder: refused before launch:\n  - {key}={directory} already holds a run "
                f"({held[0] / SUMMARY_FILE}); nothing was written. Choose a new directory "
                f"(or leave {key} unset for a fresh timestamped one)",
                file=sys.stderr,
            )
            sys.exit(2)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Single run: check ``hydra.run.dir``."""
        self._check("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Sweep: check ``hydra.sweep.dir`` and its cells."""
        self._check("hydra.sweep.dir", config.hydra.sweep.dir)
