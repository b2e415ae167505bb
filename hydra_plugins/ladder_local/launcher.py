"""``LadderLocalLauncher``: Hydra's BasicLauncher, with every cell checked first and failures summed up.

Hydra's BasicLauncher runs a sweep's cells one after another in this process. Here
``launch`` first composes every cell and runs the checks ``python train.py`` runs before
its ranks start (launchers/local_sweep.py), so a bad cell refuses the sweep before the
first cell trains, not after the cells before it have; then it runs the cells, and a cell
whose rank failed no longer stops the ones after it: the sweep ends with the list of the
cells that failed, and a table of every cell (launchers/sweep_end.py). Imports are lazy:
Hydra imports this module on every start.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.utils import JobReturn


class LadderLocalLauncher(BasicLauncher):
    """hydra/launcher=local: the cells on this host, in order, each checked before any starts."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Refuse before the first cell, or run every cell and name those that failed."""
        from pathlib import Path

        from launchers.hydra_files import put_back_sweep, remove_refused_sweep_dir
        from launchers.local_sweep import cells_refusal, name_failed_cells
        from launchers.sweep_end import print_sweep_end
        from runner.exit_codes import ExitCode

        assert self.config is not None  # Hydra calls setup() before launch()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        refusal = cells_refusal(self, job_overrides, initial_job_idx)
        if refusal is not None:
            print(f"ladder: refused before launch; {refusal}", file=sys.stderr)
            put_back_sweep(sweep_dir)  # a resumed sweep's files
            remove_refused_sweep_dir(sweep_dir)  # a new sweep's directory, made for nothing
            sys.exit(ExitCode.REFUSED)
        results = super().launch(job_overrides, initial_job_idx)
        named = name_failed_cells(results, job_overrides, initial_job_idx, sweep_dir)
        print_sweep_end(sweep_dir)  # the cells in one table, and the command that compares them
        return named
