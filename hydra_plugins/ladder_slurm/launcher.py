"""``LadderSlurmLauncher``: hydra-submitit-launcher's SlurmLauncher, with resources per cell.

The upstream launcher submits every cell of a sweep with one set of resources; here
``launch`` places each cell from its own ``gpus`` and submits one array per group of
like cells (launchers/slurm/launcher.py), and ``__call__`` runs one rank of a cell inside a
SLURM task (launchers/slurm/task.py). The inherited ``checkpoint()`` is submitit's
requeue hook for preemption and time limits (see runner/train/preemption.py). Imports are
lazy: Hydra imports this module on every start while it scans for plugins.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


class LadderSlurmLauncher(SlurmLauncher):
    """hydra/launcher=slurm: each cell its own nodes and tasks, one SLURM task per rank."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Refuse before submitting, or submit every cell, wait for them, and print the sweep's table."""
        from pathlib import Path

        from launchers.hydra_files import put_back_sweep, remove_refused_sweep_dir
        from launchers.slurm.launcher import launch_sweep
        from launchers.slurm.resources import SlurmRefused
        from launchers.sweep_end import print_sweep_end
        from runner.exit_codes import ExitCode

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        try:
            results = launch_sweep(self, job_overrides, initial_job_idx)
        except SlurmRefused as error:
            print(f"ladder: refused before launch on SLURM; {error}", file=sys.stderr)
            put_back_sweep(sweep_dir)  # a resumed sweep's files
            remove_refused_sweep_dir(sweep_dir)  # a new sweep's directory, made for nothing
            sys.exit(ExitCode.REFUSED)
        print_sweep_end(sweep_dir)  # every cell has ended: the cells in one table, and how to compare them
        return results

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        """Inside a SLURM task: run the cell's task function as this task's rank."""
        from launchers.slurm.task import run_task

        return run_task(self, sweep_overrides, job_dir_key, job_num, singleton_state)
