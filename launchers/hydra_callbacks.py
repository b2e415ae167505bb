"""Hydra callbacks: refuse to reuse a directory that already holds a run, before Hydra writes to it,
and refuse a sweep whose cells would train with different global batches.

Hydra saves ``.hydra/config.yaml`` into the run directory before the task starts, so
the check has to run earlier, in ``on_run_start`` / ``on_multirun_start``. A resume
re-enters its directory: the files Hydra is about to replace are set aside first
(launchers/hydra_files.py), for a refusal to put back; a resumed sweep restores, when it
ends, the cells it did not run. A directory that does not exist yet is noted as this run's
own, for a refusal to remove.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from launchers.hydra_files import (
    note_new_run_dir,
    note_new_sweep_dir,
    put_back_sweep,
    set_aside,
    set_aside_sweep,
)
from launchers.sweep_guard import refusal
from runner.environment import from_environment
from runner.exit_codes import ExitCode
from runner.rundir.run_files import SUMMARY_FILE
from runner.train.preemption import requeued  # LADDER_RESUME or SLURM_RESTART_COUNT > 0


def _held_runs(directory: Path) -> list[Path]:
    if (directory / SUMMARY_FILE).exists():
        return [directory]
    if not directory.is_dir():
        return []
    return sorted(p.parent for p in directory.glob(f"*/{SUMMARY_FILE}"))


def _lead() -> bool:
    """Under torchrun or srun every rank composes the config; rank 0 guards the directory,
    the others would find the files rank 0 has already started writing there."""
    launched = from_environment(os.environ)
    return launched is None or launched.rank == 0


def _resumes(config: DictConfig) -> bool:
    """A resumed run (train.resume=auto or required, or a requeued job) re-enters its own directory."""
    resume = OmegaConf.select(config, "train.resume")
    return requeued(os.environ) or getattr(resume, "value", resume) in ("auto", "required")


class ProtectRunDirs(Callback):
    """Refuse an output directory that already holds a finished or running run."""

    def _check(self, key: str, directory: str, config: DictConfig) -> None:
        lead = _lead()
        if lead and key == "hydra.run.dir":
            note_new_run_dir(Path(directory))  # removed again if the run is refused before launch
        if _resumes(config):
            if lead and key == "hydra.run.dir":
                set_aside(Path(directory))  # put back if ladder refuses this attempt
            elif lead:
                set_aside_sweep(Path(directory))
                launcher = str(config.hydra.launcher.get("_target_", ""))
                if launcher.endswith(("BasicLauncher", "LadderLocalLauncher")):
                    # Its cells run in this process, and a refused one exits it before
                    # on_multirun_end: restore the cells the sweep did not reach at exit.
                    atexit.register(put_back_sweep, Path(directory))
            return
        if not lead:
            return
        if key == "hydra.sweep.dir":
            note_new_sweep_dir(Path(directory))  # removed again if the sweep is refused before a cell
        held = _held_runs(Path(directory))
        if held:
            print(
                f"ladder: refused before launch:\n  - {key}={directory} already holds a run "
                f"({held[0] / SUMMARY_FILE}); nothing was written. Choose a new directory "
                f"(or leave {key} unset for a fresh timestamped one)",
                file=sys.stderr,
            )
            sys.exit(ExitCode.REFUSED)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Single run: check ``hydra.run.dir``."""
        self._check("hydra.run.dir", config.hydra.run.dir, config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Sweep: check ``hydra.sweep.dir`` and its cells."""
        self._check("hydra.sweep.dir", config.hydra.sweep.dir, config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """A resumed sweep is over: restore the cells it did not run (launchers/hydra_files.py)."""
        if _resumes(config) and _lead():
            put_back_sweep(Path(config.hydra.sweep.dir))


class GuardSweepBatch(Callback):
    """Refuse a sweep whose cells train with different ``batch.global_size`` (launchers/sweep_guard.py)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Enumerate the BasicSweeper's cells; exit 2 before the sweep directory exists if they differ."""
        sweeper = config.hydra.sweeper
        if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
            return  # other sweepers draw their cells at run time; see launchers/sweep_guard.py
        # As BasicSweeper.sweep does: hydra.sweeper.params first, then the command line.
        params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
        hydra = GlobalHydra.instance()
        message = refusal(
            [*params, *config.hydra.overrides.task],
            default=config.batch.global_size,
            allow_varying=config.batch.allow_varying,
            config_loader=hydra.config_loader() if hydra.is_initialized() else None,
        )
        if message is not None:
            print(message, file=sys.stderr)
            sys.exit(ExitCode.REFUSED)
