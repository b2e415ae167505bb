"""Put back each parameter group's hyperparameters and own step after a ZeRO-3 universal load.

DeepSpeed 0.19.8's ``runtime/zero/stage3.py``
``DeepSpeedZeroOptimizer_Stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3`` makes
two slips when a stage-3 engine resumes from a universal checkpoint (another layout):

- it gives every parameter group the first group's hyperparameters
  (``optim_sd[OPTIMIZER_STATE_DICT]["param_groups"][0]``): weight decay lands on the norm
  gains and biases too, which ladder's groups exempt (runner/engine/param_groups.py);
- it gives every group's state one and the same ``step`` tensor, which torch's AdamW then
  increments in place once per group and step: Adam's step count runs ahead by the number
  of groups each step, and its bias corrections with it.

:func:`repair` sets each group's hyperparameters from the saved ones (``zero/optimizer_state.pt``)
and gives each state its own step; runner/checkpoint/restore.py calls it after such a load.
"""

from __future__ import annotations

from pathlib import Path

import torch

from runner.engine.fixes import pickle_in_checkpoints as safe_load


def repair(optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Undo both slips in ``optimizer`` (torch's, inside ZeRO-3's) from universal checkpoint ``folder``."""
    saved_groups = safe_load.load(folder / "zero" / "optimizer_state.pt")["param_groups"]
    for group, saved in zip(optimizer.param_groups, saved_groups, strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})
    for state in optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()
