"""A checkpoint restored into a rank's engine: model, optimizer, LR schedule and RNG.

The ranks load the tag runner/checkpoint/resume_rules.py ``resume_tag`` names, converted
beforehand by the launching process where the layout changed
(runner/checkpoint/universal_conversion.py). Two of DeepSpeed's loads are completed by
runner/engine/fixes/: BF16_Optimizer's state at stage 0 (``bf16_stage0_optimizer_load``) and a
ZeRO-3 universal load's parameter groups (``stage3_universal_groups``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from runner.checkpoint import stage0_tp as checkpoint_stage0_tp
from runner.config import ZeroStage
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.engine.fixes import bf16_stage0_optimizer_load, stage3_universal_groups
from runner.engine.fixes import pickle_in_checkpoints as safe_load
from runner.rundir.run_files import CHECKPOINT_DIR


def load(engine: DeepSpeedEngine, run_dir: Path, *, tag: str, rank: int) -> int:
    """Restore model, optimizer, LR schedule and this rank's RNG; returns the completed steps."""
    root = run_dir / CHECKPOINT_DIR
    # Every file DeepSpeed reads here is unpickled weights-only, so a doctored one cannot run
    # code: its checkpoint engine was made weights-only with the engine's other fixes
    # (runner/engine/initialize.py apply_fixes), and weights_only_loads() below holds the
    # torch.load calls DeepSpeed makes directly.
    # no_grad: a pipeline's load ends by broadcasting the tied embedding in place, which
    # autograd would otherwise record on the weight (see runner/parallel/pipeline.py's build).
    bf16_stage0 = bf16_stage0_optimizer_load.is_bf16_stage0(engine)
    # Otherwise stage 0 reads a universal checkpoint only under tensor parallelism
    # (runner/checkpoint/resume_rules.py universal_engine).
    stage = ZeroStage(engine.zero_optimization_stage())
    stage0_tp = not bf16_stage0 and stage is ZeroStage.ddp and engine.load_universal_checkpoint()
    ladder_loads_optimizer = bf16_stage0 or stage0_tp
    loading = checkpoint_stage0_tp.engine_loading(engine) if stage0_tp else contextlib.nullcontext()
    with safe_load.weights_only_loads(), torch.no_grad(), loading:
        path, client_state = engine.load_checkpoint(
            str(root), tag=tag, load_optimizer_states=not ladder_loads_optimizer
        )
        if path is not None and bf16_stage0:
            bf16_stage0_optimizer_load.load_optimizer(engine, root, tag)
        elif path is not None and stage0_tp:
            checkpoint_stage0_tp.load(engine, root / tag, tp=engine.autotp_size())
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint {root / tag}")
    if engine.load_universal_checkpoint() and stage is ZeroStage.zero3:
        stage3_universal_groups.repair(engine.optimizer.optimizer, root / tag)
    rng = root / tag / f"rng_rank{rank}.pt"
    if rng.exists():
        # weights_only: a checkpoint file can execute no code when it is loaded.
        torch.set_rng_state(torch.load(rng, weights_only=True)["torch"])
    assert client_state is not None  # DeepSpeed returns the client state with the path it loaded
    completed: int = client_state["completed_steps"]
    return completed
