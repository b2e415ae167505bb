"""Load DeepSpeed's BF16_Optimizer state at ZeRO stage 0 (bf16 under a pipeline), as its engine does not.

DeepSpeed 0.19.8's ``runtime/engine.py`` ``DeepSpeedEngine._load_checkpoint`` treats an
optimizer without ZeRO state as one whole dict: it calls
``self.optimizer.load_state_dict(optim_checkpoint['optimizer'])`` with the model-states
file's one dict. ``runtime/bf16_optimizer.py`` ``BF16_Optimizer._load_legacy_checkpoint``
indexes that argument by data-parallel rank (``state_dict_list[dp_rank]``): the resume of
any bf16 pipeline at stage 0 fails with ``KeyError: 0``. The engine never hands it the
universal folder either, which ``_load_universal_checkpoint`` reads (a resume onto another
layout). BF16_Optimizer's own files are the ``bf16_zero_pp_rank_*`` ones, one per
data-parallel rank (``DeepSpeedEngine._get_all_zero_checkpoints``).

The engine's load runs with ``load_optimizer_states=False`` for such an engine
(runner/checkpoint/restore.py), then :func:`load_optimizer` loads the optimizer's state from
those files, or from the universal folder: the fp32 masters, then copied into the bf16
weights (the engine loads no module from a universal checkpoint).
"""

from __future__ import annotations

from pathlib import Path

from runner.config import ZeroStage
from runner.engine.deepspeed_engine import DeepSpeedEngine


def is_bf16_stage0(engine: DeepSpeedEngine) -> bool:
    """Whether the engine's optimizer is BF16_Optimizer at ZeRO stage 0 (bf16 under a pipeline)."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    zero_stage = ZeroStage(engine.zero_optimization_stage())
    return zero_stage is ZeroStage.ddp and isinstance(engine.optimizer, BF16_Optimizer)


def load_optimizer(engine: DeepSpeedEngine, root: Path, tag: str) -> None:
    """Load BF16_Optimizer's state of checkpoint ``tag`` under ``root``, from its own files or the
    universal folder, after the engine loaded the rest."""
    if engine.load_universal_checkpoint():
        engine.optimizer.load_state_dict(None, checkpoint_folder=str(root / tag))
        engine.optimizer.update_lp_params()
        return
    state_dicts = engine._get_all_zero_checkpoints(str(root), tag)
    if state_dicts is None:
        raise RuntimeError(f"{root / tag} holds no bf16_zero_pp_rank_* optimizer files of this stage")
    engine.optimizer.load_state_dict(state_dicts, load_optimizer_states=True, load_from_fp32_weights=True)
