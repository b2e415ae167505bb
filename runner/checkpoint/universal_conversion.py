"""A checkpoint converted once for another layout: DeepSpeed's universal format, and stage-0 files.

Resuming onto another layout (other dp, tp or ZeRO stage: runner/checkpoint/resume_rules.py)
goes through DeepSpeed's universal checkpoint (``deepspeed.checkpoint.ds_to_universal``),
converted once next to the original and completed so that ZeRO stages 1, 2 and 3 all load
it, whichever stage wrote it (runner/checkpoint/universal_every_stage.py). Tensor-parallel
shards are joined by the split AutoTP recorded in the checkpoint (``UNIVERSAL_CHECKPOINT_INFO``)
and sliced again on load. Stage 0 (``parallel=ddp``) crosses too, both ways, with tp, pp or
both: its checkpoint is written in the universal format by ladder, and a stage-0 run resumes
from stage-0 files written from the universal one (runner/checkpoint/stage0.py, and
runner/checkpoint/stage0_pipeline.py for a pipeline's stages), except in bf16 under a
pipeline, where DeepSpeed's BF16_Optimizer reads the universal one itself once ladder hands
it the folder (runner/engine/fixes/bf16_stage0_optimizer_load.py), and under tensor
parallelism, where each rank slices it by AutoTP's record (runner/checkpoint/stage0_tp.py).
Every checkpoint file is unpickled weights-only (runner/engine/fixes/pickle_in_checkpoints.py).

The launching process converts (:func:`convert_for`) before any rank starts; ranks started
by torchrun or srun wait for it (:func:`wait_for`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from runner.checkpoint import size as checkpoint_size
from runner.checkpoint import stage0 as checkpoint_stage0
from runner.checkpoint import stage0_pipeline as checkpoint_stage0_pipeline
from runner.checkpoint.resume_rules import needs_universal, resume_tag, universal_engine, universal_tag_for
from runner.checkpoint.universal_every_stage import loadable_at_every_stage
from runner.config import ModelConfig, OptimizerName, Precision, ZeroStage
from runner.layout import Layout
from runner.parallel import pipeline_names
from runner.rundir.checkpoint_record import PARTIAL_PREFIX, UNIVERSAL_SUFFIX, CheckpointRecord, own_layout
from runner.rundir.disk_room import folder_bytes
from runner.rundir.run_files import CHECKPOINT_DIR


def conversion(
    run_dir: Path,
    record: CheckpointRecord,
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    model: ModelConfig,
    precision: Precision,
    optimizer: OptimizerName | str,
) -> checkpoint_size.Conversion | None:
    """What :func:`convert_for` will write beside ``record`` for ``layout`` (None: nothing, or done
    already), by runner/checkpoint/size.py's arithmetic."""
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
            dp=saved.get("dp", 1) * saved.get("sp", 1),  # the ranks ZeRO cut it over
        )
    view = resume_tag(record, layout=layout, zero_stage=zero_stage, precision=precision)
    if not universal_engine(layout, zero_stage, precision) and not (root / view).is_dir():
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
    record: CheckpointRecord,
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    model: ModelConfig,
    precision: Precision,
) -> str:
    """Convert the checkpoint (once) for ``layout`` at ``zero_stage``; returns the tag its ranks load."""
    if universal_engine(layout, zero_stage, precision):
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


def universal_tag(run_dir: Path, record: CheckpointRecord, *, layout: Layout, model: ModelConfig) -> str:
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


def universal_copy(run_dir: Path, record: CheckpointRecord, model: ModelConfig) -> str:
    """The checkpoint in the universal format under the model's names, converted once; returns its
    tag (``ladder export`` reads each parameter's ``zero/<name>/fp32.pt`` from it)."""
    return _converted(run_dir, record, model, caller=EXPORT)


RESUME = "train.resume=auto"
EXPORT = "ladder export"


def _converted(run_dir: Path, record: CheckpointRecord, model: ModelConfig, *, caller: str = RESUME) -> str:
    """Convert the checkpoint to the universal format under the model's names (once); returns its tag."""
    root = run_dir / CHECKPOINT_DIR
    tag = record["tag"] + UNIVERSAL_SUFFIX
    if not (root / tag).is_dir():
        partial = root / (PARTIAL_PREFIX + tag)
        shutil.rmtree(partial, ignore_errors=True)
        # ladder joins stage 0's shards itself, under the model's names
        if ZeroStage(record["zero_stage"]) is ZeroStage.ddp:
            _stage0_to_universal(root / record["tag"], partial, record, model, caller)
        else:
            _ds_to_universal(root / record["tag"], partial, record, caller)
            if record["layout"].get("pp", 1) > 1:
                _rename_parameters(partial / "zero", lambda name: pipeline_names.model_name(model, name))
        loadable_at_every_stage(partial)
        partial.rename(root / tag)
    return tag


def _ds_to_universal(source: Path, partial: Path, record: CheckpointRecord, caller: str = RESUME) -> None:
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
        raise ValueError(_unconverted(record, converted.stderr, source, caller))


def _stage0_to_universal(
    source: Path, partial: Path, record: CheckpointRecord, model: ModelConfig, caller: str
) -> None:
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
        raise ValueError(f"{caller}: {record['tag']} cannot move to another layout: {error}") from None


def _unconverted(record: CheckpointRecord, stderr: str, source: Path, caller: str = RESUME) -> str:
    """The refusal when ds_to_universal fails: its last word, the room it had, and what to do
    instead (``caller``: the command that needed the conversion)."""
    keep = own_layout(record)
    last = (stderr.strip().splitlines() or ["(it printed nothing)"])[-1]
    room = (
        f"the universal copy goes beside the checkpoint ({folder_bytes(source) / 1e9:.3f} GB) on a "
        f"filesystem with {shutil.disk_usage(source).free / 1e9:.3f} GB free"
    )
    if caller == EXPORT:
        return (
            f"{caller}: DeepSpeed's ds_to_universal could not convert {record['tag']} to the universal "
            f"format: {last} ({room}). Export another checkpoint with --step N, or free room beside it"
        )
    return (
        f"{caller}: DeepSpeed's ds_to_universal could not convert {record['tag']} for this "
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


def wait_for(run_dir: Path, tag: str, *, timeout_s: float = 1800.0) -> None:
    """Wait until rank 0 has converted the checkpoint (ranks started by torchrun or srun)."""
    path = run_dir / CHECKPOINT_DIR / tag
    deadline = time.monotonic() + timeout_s
    while not path.is_dir():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no universal checkpoint {path} after {timeout_s:.0f} s")
        time.sleep(1.0)
