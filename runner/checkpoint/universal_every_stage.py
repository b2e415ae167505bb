"""A universal checkpoint completed so that engines at ZeRO stages 1, 2 and 3 all load it.

``ds_to_universal`` (DeepSpeed 0.19.8) writes what the source stage's own loader reads, and
the per-parameter files (``zero/<name>/fp32.pt``, ``exp_avg.pt``, ``exp_avg_sq.pt``) that
every stage reads alike. :func:`loadable_at_every_stage` fills in what differs, once, after
each conversion (runner/checkpoint/universal_conversion.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import deepspeed
import torch
from deepspeed.checkpoint.constants import DS_VERSION, OPTIMIZER_STATE_DICT, PARAM, PARAM_GROUPS

from runner.engine.fixes import pickle_in_checkpoints as safe_load


def loadable_at_every_stage(folder: Path) -> None:
    """Complete a universal checkpoint so that engines at ZeRO stages 1, 2 and 3 all load it.

    ``ds_to_universal`` (DeepSpeed 0.19.8) writes what the source stage's own loader reads,
    and the per-parameter files (``zero/<name>/fp32.pt``, ``exp_avg.pt``, ``exp_avg_sq.pt``)
    that every stage reads alike. What differs is filled in here: the model-states file
    under both stages' names, and the optimizer's global state in both stages' shapes.
    """
    _name_model_states_for_every_stage(folder)
    _complete_optimizer_state(folder)
    _compact_weight_copies(folder / "zero")


def _name_model_states_for_every_stage(folder: Path) -> None:
    """Give the model-states file (LR schedule, steps, client state) both stages' names.

    ``engine._get_all_ckpt_names`` looks for ``mp_rank_XX_model_states.pt`` at stages 1-2
    and ``zero_pp_rank_0_mp_rank_XX_model_states.pt`` at stage 3; a universal load takes
    no weights from it (they come from ``zero/``), so one file serves both: a hard link,
    which costs no room (the weights it holds would otherwise be on disk twice more).
    """
    stage3_prefix = "zero_pp_rank_0_"
    for path in folder.glob("mp_rank_*_model_states.pt"):
        if not (folder / (stage3_prefix + path.name)).exists():
            _link_or_copy(path, folder / (stage3_prefix + path.name))
    for path in folder.glob(stage3_prefix + "mp_rank_*_model_states.pt"):
        if not (folder / path.name.removeprefix(stage3_prefix)).exists():
            _link_or_copy(path, folder / path.name.removeprefix(stage3_prefix))


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source``; a copy where the filesystem has no hard links."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _complete_optimizer_state(folder: Path) -> None:
    """Write ``zero/optimizer_state.pt`` and the step files in the shapes both stages' loaders read.

    Stages 1-2 (``stage_1_and_2.py`` ``_load_global_state``) assert a ``ds_version`` and take
    Adam's step from ``zero/<name>/step.pt``; a stage-3 conversion writes neither. Stage 3
    (``stage3.py`` ``load_hp_checkpoint_state_from_checkpoint_dir_stage3``) takes the step
    and the group hyperparameters from ``optimizer_state_dict``, which a stage 1-2
    conversion leaves out.
    """
    zero = folder / "zero"
    path = zero / "optimizer_state.pt"
    state = safe_load.load(path)
    state.setdefault(DS_VERSION, deepspeed.__version__)
    step_files = sorted(zero.glob("*/step.pt"))
    if OPTIMIZER_STATE_DICT in state:  # written from stage 3: one step for every parameter
        # An optimizer without moments (SGD without momentum) keeps no state, and so no step.
        step = state[OPTIMIZER_STATE_DICT]["state"].get(0, {}).get("step")
        # It is rank 0's optimizer file whole: its fp32 partition and moments, which no loader
        # reads from here (they come from zero/<name>/), 12 B a parameter / dp on disk.
        state.pop("fp32_flat_groups", None)
        state[OPTIMIZER_STATE_DICT]["state"] = {
            index: {"step": entry["step"]} for index, entry in state[OPTIMIZER_STATE_DICT]["state"].items()
        }
        for param_dir in sorted(p.parent for p in zero.glob("*/fp32.pt")):
            _wrap_stage3_fragments(param_dir)
            if step is not None and not (param_dir / "step.pt").exists():
                torch.save(step, param_dir / "step.pt")
    elif step_files:  # written from stage 1-2: every step.pt holds the same step
        step = safe_load.load(step_files[0])
        state[OPTIMIZER_STATE_DICT] = {"state": {0: {"step": step}}, PARAM_GROUPS: state[PARAM_GROUPS]}
    torch.save(state, path)


def _compact_weight_copies(zero: Path) -> None:
    """Save again, alone, each ``fp32.pt`` that holds more than its tensor.

    ``ds_to_universal`` writes a parameter with no optimizer fragment (a tied weight's second
    name) from the model-states file, ``tensor.float()``: in fp32 the tensor itself, a view
    whose whole storage (every weight of the model, as torch.load shares it) torch.save writes.
    Read memory-mapped, a file's tensors cost nothing until copied.
    """
    for path in zero.glob("*/fp32.pt"):
        held = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        tensor = held.get(PARAM) if isinstance(held, dict) else None
        if tensor is None or tensor.untyped_storage().nbytes() <= tensor.numel() * tensor.element_size():
            continue
        fresh = path.with_name(".fp32.pt.tmp")
        torch.save({**held, PARAM: tensor.clone()}, fresh)
        os.replace(fresh, path)  # a new file: the memory map of the old one stays valid until let go


def _wrap_stage3_fragments(param_dir: Path) -> None:
    """Store a stage-3 conversion's bare tensors as ``{"param": tensor}``, the form stages 1-2 read.

    ``merge_zero3_slices`` saves the flat tensor itself; ``universal_checkpoint.py``
    ``load_hp_checkpoint_state`` (stages 1-2) indexes ``ckpt_dict["param"]``, and reads the
    flat tensor correctly at tp 1 (it chunks it once and takes its fragment by offset).
    """
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        path = param_dir / f"{key}.pt"
        if not path.exists():
            continue  # a moment the optimizer does not keep (SGD without momentum)
        fragment = safe_load.load(path)
        if torch.is_tensor(fragment):
            torch.save({PARAM: fragment}, path)
