"""A sweep cell's config as its job's task function receives it: composed, without ``hydra``.

Both sweep launchers check every cell before any runs (launchers/local_sweep.py on this
host, launchers/slurm/launcher.py before it submits), from the config Hydra composes for the cell.
"""

from __future__ import annotations

import copy

from omegaconf import DictConfig, open_dict, read_write


def task_config(cell_cfg: DictConfig) -> DictConfig:
    """The cell's config without its ``hydra`` node, as Hydra hands it to the task function."""
    task_cfg = copy.deepcopy(cell_cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg
