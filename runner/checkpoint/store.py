"""Checkpoints: periodic, atomic, the last K kept; resume restores everything a step depends on.

Layout of ``<run_dir>/checkpoints/``:

    step_00000004/          DeepSpeed's files (model, optimizer, LR schedule) + rng_rank<N>.pt
    .partial-step_00000006/ a save in progress (or one that a crash cut short): never loaded
    latest.json             the newest complete checkpoint: tag, completed steps, layout, skipped steps
    latest                  its tag alone, DeepSpeed's pointer, for zero_to_fp32.py and DeepSpeed's tools

A save goes to ``.partial-<tag>``; after every rank has written, rank 0 renames it to
``<tag>`` (an atomic rename) and only then rewrites ``latest.json`` (atomically too). A
checkpoint named in ``latest.json`` is therefore always complete. The data position is
the number of completed steps: batches are a function of (seed, step) (runner/data/batches.py).

Resuming onto another layout (other dp, tp or ZeRO stage) goes through DeepSpeed's
universal checkpoint (``deepspeed.checkpoint.ds_to_universal``), converted once next to
the original and completed so that ZeRO stages 1, 2 and 3 all load it, whichever stage
wrote it (:func:`_loadable_at_every_stage`). Tensor-parallel shards are joined by the split
AutoTP recorded in the checkpoint (``UNIVERSAL_CHECKPOINT_INFO``) and sliced again on load.
Stage 0 (``parallel=ddp``) crosses too, both ways, with tp, pp or both: its checkpoint
is written in the universal format by ladder, and a stage-0 run resumes from stage-0 files
written from the universal one (runner/checkpoint/stage0.py, and
runner/checkpoint/stage0_pipeline.py for a pipeline's stages), except in bf16 under a
pipeline, where DeepSpeed's BF16_Optimizer reads the universal one itself once ladder hands
it the folder (:func:`_load_bf16_stage0_optimizer`), and under tensor parallelism, where each
rank slices it by AutoTP's record (runner/checkpoint/stage0_tp.py). Every checkpoint file is unpickled
weights-only (runner/engine/fixes/pickle_in_checkpoints.py).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.checkpoint import UNIVERSAL_CHECKPOINT_INFO
from deepspeed.checkpoint.constants import DS_VERSION, OPTIMIZER_STATE_DICT, PARAM, PARAM_GROUPS
from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

from runner.checkpoint import stage0 as checkpoint_stage0
from runner.checkpoint import stage0_pipeline as checkpoint_stage0_pipeline
from runner.checkpoint import stage0_tp as checkpoint_stage0_tp
from runner.checkpoint import tp_splits as checkpoint_splits
from runner.config import ModelConfig, OptimizerName, Precision, ZeroStage
from runner.diagnose import disk_room
from runner.engine.distributed import barrier
from runner.engine.fixes import pickle_in_checkpoints as safe_load
from runner.layout import Layout
from runner.metrics.wall_clock import folder_bytes
from runner.parallel import pipeline_names
from runner.plan import checkpoint_size
from runner.rundir.checkpoint_record import (
    CHECKPOINT_DIR,
    LATEST_FILE,
    UNIVERSAL_SUFFIX,
    complete_checkpoints,
    own_layout,
    tag_for,
)
from runner.rundir.checkpoint_record import latest as latest  # re-exported: checkpoint.latest(run_dir)
from runner.rundir.summary import write_json_atomic

PARTIAL_PREFIX = ".partial-"
PIPELINE_VIEW_SUFFIX = "_pipeline"  # the universal checkpoint under a pipeline's parameter names
DEEPSPEED_LATEST = "latest"  # DeepSpeed's pointer file: the newest tag, for its own tools
STAGE0_SUFFIX = "_ddp"  # the universal checkpoint as a stage-0 engine's own file
# latest.json's mark of a tp x pp checkpoint whose model-states files hold every stage's
# splits (runner/checkpoint/tp_splits.py); one without it resumes on its own layout only.
STAGE_SPLITS = "every_stages_splits_recorded"


@dataclass(frozen=True)
class SaveRecord:
    """What ``latest.json`` keeps of a checkpoint beside DeepSpeed's files: the steps it holds,
    the layout and ZeRO stage that wrote it, and the loop's state a resume goes on from."""

    completed_steps: int
    layout: Layout
    zero_stage: ZeroStage | int
    skipped_steps: tuple[int, ...] = ()  # train.on_nonfinite=skip's skipped steps so far
    noise_scale: dict[str, Any] | None = None  # runner/metrics/noise_scale.py's EMAs
    loss_scale: dict[str, Any] | None = None  # fp16's dynamic loss scale


def save(
    engine: Any, run_dir: Path, record: SaveRecord, *, rank: int, keep: int, expected_bytes: int = 0
) -> None:
    """Write a checkpoint of every rank's state; collective: every rank calls it.

    A rank that cannot write its files (a full disk, a quota) removes the save in progress,
    so the space goes back and the run's failure can be recorded, and raises
    :class:`CheckpointWriteError`; ``latest.json`` still names the checkpoint before.
    ``expected_bytes``: the whole checkpoint's size (runner/plan/checkpoint_size.py), for that error.

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
    elif zero_stage == 3 and layout.tp > 1:
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
                "layout": layout.record(),
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


def _precision(engine: Any) -> str:
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


def needs_universal(record: dict[str, Any], *, layout: Layout, zero_stage: ZeroStage | int) -> bool:
    """Whether resuming ``record`` on this layout needs DeepSpeed's universal checkpoint."""
    saved = record["layout"]
    saved_split = (saved.get("tp", 1), saved.get("pp", 1))
    if record["zero_stage"] == zero_stage == 0 and saved_split == (layout.tp, layout.pp):
        # Stage 0 saves the whole model and optimizer state once per model-parallel rank
        # (mp_rank_XX_model_states.pt, or a pipeline's layer_XX files), which DeepSpeed
        # loads as it is at any dp; but in bf16 under a pipeline its BF16_Optimizer cuts
        # the optimizer state over the data-parallel ranks, like ZeRO-1.
        bf16_pipeline = layout.pp > 1 and record.get("precision") == Precision.bf16.value
        return bf16_pipeline and saved["dp"] != layout.dp
    return (saved["dp"], *saved_split, record["zero_stage"]) != (layout.dp, layout.tp, layout.pp, zero_stage)


def check_resumable(
    record: dict[str, Any],
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    optimizer: OptimizerName | str = OptimizerName.adamw,
) -> None:
    """Refuse a resume ladder cannot do, before any rank starts."""
    saved = record["layout"]
    if saved["global_size"] != layout.global_size:
        raise ValueError(
            f"train.resume=auto: the checkpoint trained with batch.global_size={saved['global_size']}, "
            f"this run asks {layout.global_size}; a different global batch is a different experiment: "
            f"set batch.global_size={saved['global_size']} or start a new run directory"
        )
    if not needs_universal(record, layout=layout, zero_stage=zero_stage):
        return
    if optimizer != OptimizerName.adamw:
        # ds_to_universal (and ladder's stage-0 conversion) carry Adam's exp_avg and exp_avg_sq.
        raise ValueError(
            f"train.resume=auto: {record['tag']} would move to another layout through DeepSpeed's "
            f"universal format, which carries Adam's state only "
            f"(optimizer={OptimizerName(optimizer).value} has none of it): resume on the checkpoint's "
            f"own layout ({own_layout(record)}), or start a new run directory"
        )
    cut_both_ways = saved.get("pp", 1) > 1 and saved.get("tp", 1) > 1
    if cut_both_ways and record["zero_stage"] != 0 and not record.get(STAGE_SPLITS):
        # Without every stage's splits ds_to_universal joins a stage's shards along dimension 0,
        # wrong for the row-split and whole tensors: a ZeRO checkpoint of an earlier ladder.
        # (ladder joins a stage-0 checkpoint's shards itself: runner/checkpoint/stage0_pipeline.py.)
        raise ValueError(
            f"train.resume=auto: the checkpoint {record['tag']} was written at pp {saved['pp']}, tp "
            f"{saved['tp']} without the record of how every stage split its tensors, so it resumes on "
            f"its own layout only: keep gpus={saved['gpus']} parallel.pp={saved['pp']} "
            f"parallel.tp={saved['tp']} parallel.zero_stage={record['zero_stage']}, or start a new run "
            f"directory"
        )


def universal_tag_for(record: dict[str, Any], layout: Layout) -> str:
    """The tag a ZeRO rank of ``layout`` loads ``record`` from when it resumes through the universal one."""
    tag = record["tag"] + UNIVERSAL_SUFFIX
    return tag + PIPELINE_VIEW_SUFFIX if layout.pp > 1 else tag


def _universal_engine(layout: Layout, zero_stage: ZeroStage | int, precision: Precision) -> bool:
    """Whether this layout's engine loads a universal checkpoint itself: ZeRO 1-3; stage 0 in bf16
    under a pipeline (DeepSpeed's BF16_Optimizer, runner/checkpoint/stage0_pipeline.py); stage 0
    under tensor parallelism (its ranks slice it: runner/checkpoint/stage0_tp.py)."""
    return zero_stage != 0 or (layout.pp > 1 and precision == Precision.bf16) or layout.tp > 1


def resume_tag(
    record: dict[str, Any],
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    precision: Precision = Precision.fp32,
) -> str:
    """The tag the ranks of ``layout`` at ``zero_stage`` in ``precision`` load ``record`` from."""
    if not needs_universal(record, layout=layout, zero_stage=zero_stage):
        return str(record["tag"])
    if not _universal_engine(layout, zero_stage, precision):
        return record["tag"] + UNIVERSAL_SUFFIX + STAGE0_SUFFIX
    return universal_tag_for(record, layout)


def loads_universal(
    record: dict[str, Any],
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    precision: Precision = Precision.fp32,
) -> bool:
    """Whether DeepSpeed reads the resume's files in the universal format (onto another layout)."""
    universal = _universal_engine(layout, zero_stage, precision)
    return universal and needs_universal(record, layout=layout, zero_stage=zero_stage)


def conversion(
    run_dir: Path,
    record: dict[str, Any],
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    model: ModelConfig,
    precision: Precision,
    optimizer: OptimizerName | str,
) -> checkpoint_size.Conversion | None:
    """What :func:`convert_for` will write beside ``record`` for ``layout`` (None: nothing, or done
    already), by runner/plan/checkpoint_size.py's arithmetic."""
    if optimizer != OptimizerName.adamw or not needs_universal(record, layout=layout, zero_stage=zero_stage):
        return None  # nothing to convert (or refused by check_resumable)
    root = run_dir / CHECKPOINT_DIR
    stays = peak = 0
    if not (root / (record["tag"] + UNIVERSAL_SUFFIX)).is_dir():
        saved = record["layout"]
        stays, peak = checkpoint_size.universal_bytes(
            model,
            optimizer=optimizer,
            zero_stage=record["zero_stage"],
            precision=record.get("precision", Precision.fp32.value),
            tp=saved.get("tp", 1),
            pp=saved.get("pp", 1),
            dp=saved.get("dp", 1),
        )
    view = resume_tag(record, layout=layout, zero_stage=zero_stage, precision=precision)
    if not _universal_engine(layout, zero_stage, precision) and not (root / view).is_dir():
        stays += checkpoint_size.checkpoint_bytes(
            model, precision=precision.value, optimizer=optimizer, zero_stage=0, pp=layout.pp
        )
        peak = max(peak, stays)
    if not stays:
        return None
    return checkpoint_size.Conversion(
        tag=record["tag"], stays=stays, peak=peak, own_layout=own_layout(record)
    )


def convert_for(
    run_dir: Path,
    record: dict[str, Any],
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    model: ModelConfig,
    precision: Precision,
) -> str:
    """Convert the checkpoint (once) for ``layout`` at ``zero_stage``; returns the tag its ranks load."""
    if _universal_engine(layout, zero_stage, precision):
        return universal_tag(run_dir, record, layout=layout, model=model)
    root = run_dir / CHECKPOINT_DIR
    universal = root / _converted(run_dir, record, model)
    view = resume_tag(record, layout=layout, zero_stage=zero_stage, precision=precision)
    if not (root / view).is_dir():
        partial = root / (PARTIAL_PREFIX + view)
        shutil.rmtree(partial, ignore_errors=True)
        try:
            if layout.pp > 1:
                checkpoint_stage0_pipeline.from_universal(
                    universal, partial, model, pp=layout.pp, precision=precision
                )
            else:
                checkpoint_stage0.from_universal(universal, partial, model, precision)
        except ValueError as error:
            shutil.rmtree(partial, ignore_errors=True)
            raise ValueError(
                f"train.resume=auto: {record['tag']} cannot resume as parallel=ddp: {error}"
            ) from None
        partial.rename(root / view)
    return view


def universal_tag(run_dir: Path, record: dict[str, Any], *, layout: Layout, model: ModelConfig) -> str:
    """Convert the checkpoint to DeepSpeed's universal format (once) for ``layout``; returns its tag.

    The universal checkpoint names each parameter as runner/model/transformer.py's Transformer does: a
    pipeline's checkpoint is renamed after the conversion, and a pipeline resuming from it
    reads it through a view under its own names (runner/parallel/pipeline_names.py).
    """
    root = run_dir / CHECKPOINT_DIR
    tag = _converted(run_dir, record, model)
    if layout.pp == 1:
        return tag
    view = universal_tag_for(record, layout)
    if not (root / view).is_dir():
        partial = root / (PARTIAL_PREFIX + view)
        shutil.rmtree(partial, ignore_errors=True)
        _link_as_pipeline(root / tag, partial, model)
        partial.rename(root / view)
    return view


def universal_copy(run_dir: Path, record: dict[str, Any], model: ModelConfig) -> str:
    """The checkpoint in the universal format under the model's names, converted once; returns its
    tag (``ladder export`` reads each parameter's ``zero/<name>/fp32.pt`` from it)."""
    return _converted(run_dir, record, model)


def _converted(run_dir: Path, record: dict[str, Any], model: ModelConfig) -> str:
    """Convert the checkpoint to the universal format under the model's names (once); returns its tag."""
    root = run_dir / CHECKPOINT_DIR
    tag = record["tag"] + UNIVERSAL_SUFFIX
    if not (root / tag).is_dir():
        partial = root / (PARTIAL_PREFIX + tag)
        shutil.rmtree(partial, ignore_errors=True)
        if record["zero_stage"] == 0:  # ladder joins stage 0's shards itself, under the model's names
            _stage0_to_universal(root / record["tag"], partial, record, model)
        else:
            _ds_to_universal(root / record["tag"], partial, record)
            if record["layout"].get("pp", 1) > 1:
                _rename_parameters(partial / "zero", lambda name: pipeline_names.model_name(model, name))
        _loadable_at_every_stage(partial)
        partial.rename(root / tag)
    return tag


def _ds_to_universal(source: Path, partial: Path, record: dict[str, Any]) -> None:
    """DeepSpeed's conversion of a ZeRO 1-3 checkpoint, in a subprocess; refused with its last word."""
    converted = subprocess.run(
        [
            sys.executable,
            "-m",
            # deepspeed.checkpoint.ds_to_universal, weights-only loads
            "runner.engine.fixes.pickle_in_checkpoints",
            "--input_folder",
            str(source),
            "--output_folder",
            str(partial),
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
        ],
        capture_output=True,
        text=True,
    )
    # ds_to_universal points `latest_universal` beside its output at the folder it wrote, which
    # ladder renames once complete: a pointer to a folder that never exists, so it goes.
    pointer = partial.parent / "latest_universal"
    if pointer.is_file() and pointer.read_text().strip() == partial.name:
        pointer.unlink()
    if converted.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise ValueError(_unconverted(record, converted.stderr, source))


def _stage0_to_universal(source: Path, partial: Path, record: dict[str, Any], model: ModelConfig) -> None:
    """ladder's conversion of a stage-0 checkpoint (runner/checkpoint/stage0.py); refused with its reason."""
    partial.mkdir(parents=True)
    try:
        pp, tp = record["layout"].get("pp", 1), record["layout"].get("tp", 1)
        if pp > 1:
            checkpoint_stage0_pipeline.to_universal(source, partial, model, pp=pp, tp=tp)
        else:
            checkpoint_stage0.to_universal(source, partial, model, tp=tp)
    except ValueError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise ValueError(
            f"train.resume=auto: {record['tag']} cannot move to another layout: {error}"
        ) from None


def _unconverted(record: dict[str, Any], stderr: str, source: Path) -> str:
    """The refusal when ds_to_universal fails: its last word, the room it had, and how to resume
    all the same."""
    keep = own_layout(record)
    last = (stderr.strip().splitlines() or ["(it printed nothing)"])[-1]
    room = (
        f"the universal copy goes beside the checkpoint ({folder_bytes(source) / 1e9:.3f} GB) on a "
        f"filesystem with {shutil.disk_usage(source).free / 1e9:.3f} GB free"
    )
    return (
        f"train.resume=auto: DeepSpeed's ds_to_universal could not convert {record['tag']} for this "
        f"layout: {last} ({room}). Resume on the checkpoint's own layout ({keep}), or start a new run "
        f"directory"
    )


def _rename_parameters(zero: Path, rename: Callable[[str], str]) -> None:
    """Rename each parameter's folder (``zero/<name>/fp32.pt`` ...) of a universal checkpoint."""
    for folder in [path for path in zero.iterdir() if path.is_dir()]:
        folder.rename(zero / rename(folder.name))


def _link_as_pipeline(universal: Path, view: Path, model: ModelConfig) -> None:
    """A folder that shows ``universal`` under the pipeline's parameter names, by relative links."""
    (view / "zero").mkdir(parents=True)
    for path in universal.iterdir():
        if path.name != "zero":
            (view / path.name).symlink_to(Path("..") / universal.name / path.name)
    for path in (universal / "zero").iterdir():
        name = pipeline_names.pipeline_name(model, path.name) if path.is_dir() else path.name
        (view / "zero" / name).symlink_to(Path("../..") / universal.name / "zero" / path.name)


def _loadable_at_every_stage(folder: Path) -> None:
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
        step = state[OPTIMIZER_STATE_DICT]["state"][0]["step"]
        # It is rank 0's optimizer file whole: its fp32 partition and moments, which no loader
        # reads from here (they come from zero/<name>/), 12 B a parameter / dp on disk.
        state.pop("fp32_flat_groups", None)
        state[OPTIMIZER_STATE_DICT]["state"] = {
            index: {"step": entry["step"]} for index, entry in state[OPTIMIZER_STATE_DICT]["state"].items()
        }
        for param_dir in sorted(p.parent for p in zero.glob("*/fp32.pt")):
            _wrap_stage3_fragments(param_dir)
            if not (param_dir / "step.pt").exists():
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


def _is_bf16_stage0(engine: Any) -> bool:
    """Whether the engine's optimizer is BF16_Optimizer at ZeRO stage 0 (bf16 under a pipeline)."""
    return engine.zero_optimization_stage() == 0 and isinstance(engine.optimizer, BF16_Optimizer)


def _load_bf16_stage0_optimizer(engine: Any, root: Path, tag: str) -> None:
    """Load BF16_Optimizer's state as DeepSpeed 0.19.8's engine does not at stage 0.

    The engine hands it the model-states file's one dict, which it indexes by data-parallel
    rank (``_load_legacy_checkpoint``: KeyError 0), and never the universal folder it reads
    in ``_load_universal_checkpoint``. Its own files are the ``bf16_zero_pp_rank_*`` ones,
    one per data-parallel rank (``_get_all_zero_checkpoints``); from a universal checkpoint
    the fp32 masters are loaded, then copied into the bf16 weights (the engine loads no
    module from a universal checkpoint).
    """
    if engine.load_universal_checkpoint():
        engine.optimizer.load_state_dict(None, checkpoint_folder=str(root / tag))
        engine.optimizer.update_lp_params()
        return
    state_dicts = engine._get_all_zero_checkpoints(str(root), tag)
    if state_dicts is None:
        raise RuntimeError(f"{root / tag} holds no bf16_zero_pp_rank_* optimizer files of this stage")
    engine.optimizer.load_state_dict(state_dicts, load_optimizer_states=True, load_from_fp32_weights=True)


def wait_for(run_dir: Path, tag: str, *, timeout_s: float = 1800.0) -> None:
    """Wait until rank 0 has converted the checkpoint (ranks started by torchrun or srun)."""
    path = run_dir / CHECKPOINT_DIR / tag
    deadline = time.monotonic() + timeout_s
    while not path.is_dir():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no universal checkpoint {path} after {timeout_s:.0f} s")
        time.sleep(1.0)


def load(engine: Any, run_dir: Path, *, tag: str, rank: int) -> int:
    """Restore model, optimizer, LR schedule and this rank's RNG; returns the completed steps."""
    root = run_dir / CHECKPOINT_DIR
    # Every file DeepSpeed reads here is unpickled weights-only, so a doctored one cannot run
    # code: its checkpoint engine was made weights-only with the engine's other fixes
    # (runner/engine/initialize.py apply_fixes), and weights_only_loads() below holds the
    # torch.load calls DeepSpeed makes directly.
    # no_grad: a pipeline's load ends by broadcasting the tied embedding in place, which
    # autograd would otherwise record on the weight (see runner/parallel/pipeline.py's build).
    bf16_stage0 = _is_bf16_stage0(engine)
    # Otherwise stage 0 reads a universal checkpoint only under tensor parallelism (_universal_engine).
    stage0_tp = (
        not bf16_stage0 and engine.zero_optimization_stage() == 0 and engine.load_universal_checkpoint()
    )
    ladder_loads_optimizer = bf16_stage0 or stage0_tp
    loading = checkpoint_stage0_tp.engine_loading(engine) if stage0_tp else contextlib.nullcontext()
    with safe_load.weights_only_loads(), torch.no_grad(), loading:
        path, client_state = engine.load_checkpoint(
            str(root), tag=tag, load_optimizer_states=not ladder_loads_optimizer
        )
        if path is not None and bf16_stage0:
            _load_bf16_stage0_optimizer(engine, root, tag)
        elif path is not None and stage0_tp:
            checkpoint_stage0_tp.load(engine, root / tag, tp=engine.autotp_size())
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint {root / tag}")
    if engine.load_universal_checkpoint() and engine.zero_optimization_stage() == 3:
        _repair_stage3_universal_load(engine.optimizer.optimizer, root / tag)
    rng = root / tag / f"rng_rank{rank}.pt"
    if rng.exists():
        # weights_only: a checkpoint file can execute no code when it is loaded.
        torch.set_rng_state(torch.load(rng, weights_only=True)["torch"])
    completed: int = client_state["completed_steps"]
    return completed


def _wrap_stage3_fragments(param_dir: Path) -> None:
    """Store a stage-3 conversion's bare tensors as ``{"param": tensor}``, the form stages 1-2 read.

    ``merge_zero3_slices`` saves the flat tensor itself; ``universal_checkpoint.py``
    ``load_hp_checkpoint_state`` (stages 1-2) indexes ``ckpt_dict["param"]``, and reads the
    flat tensor correctly at tp 1 (it chunks it once and takes its fragment by offset).
    """
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        path = param_dir / f"{key}.pt"
        fragment = safe_load.load(path)
        if torch.is_tensor(fragment):
            torch.save({PARAM: fragment}, path)


def _repair_stage3_universal_load(optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Undo two slips of DeepSpeed 0.19.8's stage-3 universal load in ``optimizer`` (torch's).

    ``load_hp_checkpoint_state_from_checkpoint_dir_stage3`` gives every parameter group the
    first group's hyperparameters (here: weight decay on the norm gains too), and one step
    tensor to every group, which AdamW then increments in place once per group and step.
    """
    saved_groups = safe_load.load(folder / "zero" / "optimizer_state.pt")["param_groups"]
    for group, saved in zip(optimizer.param_groups, saved_groups, strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})
    for state in optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"] = state["step"].clone()


def truncate_metrics(path: Path, *, completed_steps: int) -> None:
    """Keep only the metric lines of steps the checkpoint covers (resumed steps are logged again)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] < completed_steps:
                kept.append(line)
        except (ValueError, KeyError):
            continue  # a line cut short by a kill: dropped
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)
