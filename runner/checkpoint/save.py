"""Checkpoints are saved periodically and atomically, and only the last K are kept.

Layout of ``<run_dir>/checkpoints/``:

    step_00000004/          DeepSpeed's files (model, optimizer, LR schedule) + rng_rank<N>.pt
    .partial-step_00000006/ a save in progress (or one that a crash cut short): never loaded
    latest.json             the newest complete checkpoint: tag, completed steps, layout, skipped steps
    latest                  its tag alone, DeepSpeed's pointer, for zero_to_fp32.py and DeepSpeed's tools

A save goes to ``.partial-<tag>``; after every rank has written, rank 0 renames it to
``<tag>`` (an atomic rename) and only then rewrites ``latest.json`` (atomically too). A
checkpoint named in ``latest.json`` is therefore always complete. The data position is
the number of completed steps: batches are a function of (seed, step) (runner/data/batches.py).
runner/checkpoint/restore.py loads a checkpoint; runner/checkpoint/resume_rules.py says
which one a layout can resume from.
"""

from __future__ import annotations

import gc
import os
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from deepspeed.checkpoint import UNIVERSAL_CHECKPOINT_INFO

from runner.checkpoint import tp_splits as checkpoint_splits
from runner.config import Precision, ZeroStage
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.engine.distributed import barrier
from runner.layout import Layout
from runner.rundir import disk_room
from runner.rundir.atomic_json import write_json_atomic
from runner.rundir.checkpoint_record import (
    PARTIAL_PREFIX,
    STAGE_SPLITS,
    UNIVERSAL_SUFFIX,
    LossScaleState,
    NoiseScaleState,
    complete_checkpoints,
    tag_for,
)
from runner.rundir.run_files import CHECKPOINT_DIR, LATEST_FILE

DEEPSPEED_LATEST = "latest"  # DeepSpeed's pointer file: the newest tag, for its own tools


@dataclass(frozen=True)
class SaveRecord:
    """What ``latest.json`` keeps of a checkpoint beside DeepSpeed's files: the steps it holds,
    the layout and ZeRO stage that wrote it, and the loop's state a resume goes on from."""

    completed_steps: int
    layout: Layout
    zero_stage: ZeroStage | int
    skipped_steps: tuple[int, ...] = ()  # train.on_nonfinite=skip's skipped steps so far
    noise_scale: NoiseScaleState | None = None  # runner/metrics/noise_scale.py's EMAs
    loss_scale: LossScaleState | None = None  # fp16's dynamic loss scale


def save(
    engine: DeepSpeedEngine,
    run_dir: Path,
    record: SaveRecord,
    *,
    rank: int,
    keep: int,
    expected_bytes: int = 0,
) -> None:
    """Write a checkpoint of every rank's state; collective: every rank calls it.

    A rank that cannot write its files (a full disk, a quota) removes the save in progress,
    so the space goes back and the run's failure can be recorded, and raises
    :class:`CheckpointWriteError`; ``latest.json`` still names the checkpoint before.
    ``expected_bytes``: the whole checkpoint's size (runner/checkpoint/size.py), for that error.

    The record's ``skipped_steps`` (train.on_nonfinite=skip, runner/train/nonfinite.py) go into
    ``latest.json``,
    so a resumed run counts them against train.max_skipped_steps; so does rank 0's noise
    scale state (runner/metrics/noise_scale.py, the same on every rank), so its EMAs go on, and in
    fp16 the dynamic loss scale's (runner/engine/fixes/fp16_stage0_loss_scale.py), so it goes on on any
    layout.
    """
    root = run_dir / CHECKPOINT_DIR
    completed_steps, layout, zero_stage = record.completed_steps, record.layout, record.zero_stage
    tag = tag_for(completed_steps)
    partial = PARTIAL_PREFIX + tag

    # UNIVERSAL_CHECKPOINT_INFO marks the checkpoint convertible by ds_to_universal. A model
    # AutoTP cut carries its own (how each tensor was split: runner/parallel/shard_build.py), which
    # DeepSpeed saves; client_state is written over it, so it must not name the key then.
    client_state: dict[str, Any] = {"completed_steps": completed_steps}
    if getattr(engine.module, UNIVERSAL_CHECKPOINT_INFO, None) is None:
        client_state[UNIVERSAL_CHECKPOINT_INFO] = {}
    elif ZeroStage(zero_stage) is ZeroStage.zero3 and layout.tp > 1:
        checkpoint_splits.record_whole_replicated_shapes(engine.module, tp=layout.tp)
    elif layout.pp > 1 and layout.tp > 1:  # for ds_to_universal (ZeRO 1); harmless at stage 0
        checkpoint_splits.record_every_stages_splits(engine.module)
    try:
        engine.save_checkpoint(str(root), tag=partial, client_state=client_state, save_latest=False)
        torch.save({"torch": torch.get_rng_state()}, root / partial / f"rng_rank{rank}.pt")
    except Exception as error:
        raise _unwritten(root, tag, error, expected_bytes=expected_bytes) from error
    barrier()
    if rank == 0:
        final = root / tag
        if final.exists():
            shutil.rmtree(final)
        (root / partial).rename(final)
        write_json_atomic(
            root / LATEST_FILE,
            {
                "tag": tag,
                "completed_steps": completed_steps,
                "layout": layout.to_json(),
                "zero_stage": zero_stage,
                "precision": _precision(engine),
                "skipped_steps": list(record.skipped_steps),
                "noise_scale": record.noise_scale,
                **({"fp16_loss_scale": record.loss_scale} if record.loss_scale else {}),
                **({STAGE_SPLITS: True} if layout.pp > 1 and layout.tp > 1 else {}),
            },
        )
        _write_deepspeed_latest(root, tag)
        _prune(root, keep=keep, newest=tag)
    barrier()


def _write_deepspeed_latest(root: Path, tag: str) -> None:
    """DeepSpeed's own pointer, ``checkpoints/latest`` (the tag as text), written atomically.

    ladder loads by tag and saves with ``save_latest=False``; DeepSpeed's tools that read a
    checkpoint folder without a tag (the ``zero_to_fp32.py`` it copies beside a ZeRO run's
    checkpoints, ``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``)
    look for this file.
    """
    fresh = root / ".latest.tmp"
    fresh.write_text(tag)
    os.replace(fresh, root / DEEPSPEED_LATEST)


class CheckpointWriteError(RuntimeError):
    """A rank could not write its part of a checkpoint."""


def _unwritten(root: Path, tag: str, error: Exception, *, expected_bytes: int) -> CheckpointWriteError:
    """Remove the save in progress; say why it failed, the free space, and what continues the run."""
    # The failed writer's frames still hold its open file: the space comes back once they let go.
    cause: BaseException | None = error
    while cause is not None:
        traceback.clear_frames(cause.__traceback__)
        cause = cause.__context__
    gc.collect()
    shutil.rmtree(root / (PARTIAL_PREFIX + tag), ignore_errors=True)
    free = shutil.disk_usage(root).free
    lacking = expected_bytes > free or disk_room.out_of_room(error)
    room = (
        f"no room: the checkpoint is about {expected_bytes / 1e9:.3f} GB and {free / 1e9:.3f} GB is free"
        if lacking
        else f"{free / 1e9:.3f} GB is free"
    )
    return CheckpointWriteError(
        f"checkpoint {tag} was not written ({type(error).__name__}: {str(error).strip()[:200]}); "
        f"its partial files are removed; on the filesystem of {root} {room}; "
        + disk_room.continue_words(root.parent, needs_room=lacking)
    )


def _precision(engine: DeepSpeedEngine) -> str:
    """The engine's training precision, as precision.name says it."""
    if engine.bfloat16_enabled():
        return Precision.bf16.value
    return Precision.fp16.value if engine.fp16_enabled() else Precision.fp32.value


def _prune(root: Path, *, keep: int, newest: str) -> None:
    """Keep the ``keep`` newest complete checkpoints; drop the rest and any partial save."""
    complete = complete_checkpoints(root)
    for old in complete[: max(0, len(complete) - max(keep, 1))]:
        if old.name != newest:
            shutil.rmtree(old, ignore_errors=True)
            for converted in root.glob(old.name + UNIVERSAL_SUFFIX + "*"):
                shutil.rmtree(converted, ignore_errors=True)
    for partial in root.glob(PARTIAL_PREFIX + "*"):
        shutil.rmtree(partial, ignore_errors=True)
