"""``ladder export RUN_DIR OUT_DIR``: a checkpoint of any layout as a Hugging Face model directory.

The checkpoint goes through DeepSpeed's universal format first
(runner/checkpoint/universal_conversion.py ``universal_copy``, converted once beside it, as a
resume onto another layout converts it),
which holds every parameter whole under ladder's names, ``zero/<name>/fp32.pt``, whatever
layout wrote it: ddp, ZeRO 1-3, tp, pp and their mixes. The conversion runs in a child process
(it holds the optimizer's state too); this process then streams: one tensor is read
(memory-mapped), renamed (runner/model/hf_names.py) and added to the shard being filled, and
a full shard is written and let go. The host holds at most one shard and one tensor.

OUT_DIR holds what ``transformers.AutoModelForCausalLM.from_pretrained`` loads:

    config.json                       runner/model/hf_config.py hf_config_from_model
    ladder_export.json                the run directory, tag and step the weights came from
    tokenizer.json, ...               the run's tokenizer (data.tokenizer), if it named one
    model.safetensors                 one shard, or
    model-0000K-of-0000N.safetensors  several, and model.safetensors.index.json (weight_map)

Shard names and the index follow transformers' ``save_pretrained`` (modeling_utils.py,
huggingface_hub ``split_torch_state_dict_into_shards``). Everything is written into a hidden
sibling directory first and renamed at the end: an export that fails leaves no half-written
OUT_DIR.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch
import yaml
from deepspeed.checkpoint.constants import PARAM

from runner.checkpoint import universal_conversion
from runner.config import ModelConfig
from runner.data.tokenizer_dir import (
    EOS_NAMED_KEY,
    EXPORT_RECORD,
    TOKENIZER_CONFIG_FILE,
    eos_token,
    tokenizer_files,
    tokenizer_identity,
    tokenizer_sha256,
)
from runner.errors import ConfigError
from runner.exit_codes import ExitCode
from runner.model.hf_config import hf_config_from_model, resolve_hf_model
from runner.model.hf_names import hf_shapes
from runner.rundir.checkpoint_record import UNIVERSAL_SUFFIX, CheckpointRecord, latest, tag_for
from runner.rundir.run_files import CHECKPOINT_DIR, HYDRA_CONFIG_FILE, HYDRA_DIR
from runner.rundir.summary import run_summary
from runner.rundir.summary_records import TokenizerRecord

CONFIG_FILE = "config.json"
SINGLE_SHARD = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PROVENANCE_FILE = EXPORT_RECORD
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained default, "5GB" (GB = 1e9)


class ExportError(ValueError):
    """An export refused before anything is written: what is wrong and the fix."""


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote and what it cost the host."""

    out_dir: Path
    tag: str
    shards: int
    tensors: int
    largest_shard_bytes: int
    largest_tensor_bytes: int
    peak_host_bytes: int  # this process's high-water RSS: the streaming
    conversion_peak_host_bytes: int  # the child that converted the checkpoint (0: converted before)


def model_config(run_dir: Path) -> ModelConfig:
    """The run's model, from the composed config Hydra saved (``.hydra/config.yaml``)."""
    path = run_dir / HYDRA_DIR / HYDRA_CONFIG_FILE
    if not path.is_file():
        raise ExportError(f"{run_dir}: no .hydra/config.yaml; is it a ladder run directory?")
    saved = yaml.safe_load(path.read_text()).get("model") or {}
    values: dict[str, Any] = {}
    for field in dataclasses.fields(ModelConfig):
        if field.name in saved:
            default = field.default
            value = saved[field.name]
            values[field.name] = type(default)(value) if isinstance(default, Enum) else value
    try:
        return resolve_hf_model(ModelConfig(**values))
    except ConfigError as error:
        raise ExportError(
            f"{run_dir}'s model.hf_config={values.get('hf_config')} no longer reads as the run's model "
            f"(run ladder export from the directory the run started in, or put the file back):\n{error}"
        ) from None


def checkpoint_record(run_dir: Path, step: int | None) -> CheckpointRecord:
    """The checkpoint to export: the newest complete one, or the one after ``step`` steps, with
    the layout and ZeRO stage that wrote it."""
    newest = latest(run_dir)
    root = run_dir / CHECKPOINT_DIR
    complete = sorted(p.name for p in root.glob("step_*") if p.is_dir() and UNIVERSAL_SUFFIX not in p.name)
    if newest is None:
        raise ExportError(
            f"{run_dir}: no complete checkpoint (checkpoints/latest.json names none that exists); "
            "a run saves one after its last step unless train.save_final=false, and every "
            "train.checkpoint_every=N steps: train it again (train.resume=auto starts it over in the "
            "same directory and saves at its end), or export a run that saved one"
        )
    if step is None or tag_for(step) == newest["tag"]:
        return newest
    tag = tag_for(step)
    if tag not in complete:
        steps = ", ".join(str(int(name.removeprefix("step_"))) for name in complete)
        raise ExportError(
            f"--step {step}: {run_dir} holds no complete checkpoint {tag}; try --step in {{{steps}}}"
        )
    # The segment of the layout history that trained the step wrote the checkpoint.
    segments = [s for s in run_summary(run_dir).layout_history or [] if s["from_step"] < step]
    if not segments:
        raise ExportError(
            f"--step {step}: summary.json does not say which layout wrote {tag}; export the newest"
        )
    seg = segments[-1]
    layout = {key: seg[key] for key in ("gpus", "dp", "tp", "pp", "micro_size", "accum_steps", "global_size")}
    return {
        "tag": tag,
        "completed_steps": step,
        "layout": layout,
        "zero_stage": seg["zero_stage"],
        "precision": seg["precision"],
    }


def _shard_plan(sizes: list[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Tensors in order, cut into shards of at most ``max_bytes`` (a larger tensor alone), as
    huggingface_hub ``split_torch_state_dict_into_shards`` fills them."""
    shards: list[list[str]] = [[]]
    filled = 0
    for name, size in sizes:
        if shards[-1] and filled + size > max_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += size
    return shards


def _shard_name(index: int, count: int) -> str:
    return SINGLE_SHARD if count == 1 else f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def _read_tensor(zero: Path, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Parameter ``name``'s whole fp32 tensor from the universal ``zero`` folder, read memory-mapped
    (ZeRO-3's conversion stores it flat)."""
    path = zero / name / "fp32.pt"
    if not path.is_file():
        raise ExportError(f"the universal checkpoint has no {name}/fp32.pt: was it written by another model?")
    held = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    tensor = held[PARAM] if isinstance(held, dict) else held
    if tensor.numel() != torch.Size(shape).numel():
        raise ExportError(
            f"{name}: the checkpoint holds {tensor.numel()} elements, the run's model {shape}: "
            "was it written by another model?"
        )
    return tensor.reshape(shape).float().contiguous().clone()


def _convert_in_child(run_dir: Path, record: CheckpointRecord) -> tuple[str, int]:
    """The universal copy's tag, converting it in a child process if needed; the child's peak RSS."""
    tag = record["tag"] + UNIVERSAL_SUFFIX
    if (run_dir / CHECKPOINT_DIR / tag).is_dir():
        return tag, 0
    done = subprocess.run(
        [sys.executable, "-m", __name__, str(run_dir), json.dumps(record)],
        capture_output=True,
        text=True,
    )
    if done.returncode != ExitCode.OK:
        last = (done.stderr.strip().splitlines() or ["(it printed nothing)"])[-1]
        # The child's refusal names this command already; the CLI puts it in front once.
        last = last.removeprefix(f"{universal_conversion.EXPORT}: ")
        raise ExportError(f"{record['tag']}: the conversion to the universal format failed: {last}")
    return tag, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def run_tokenizer(run_dir: Path, override: Path | None) -> TokenizerRecord | None:
    """The identity of the tokenizer to copy: the one summary.json records (at its path, or at
    ``override``), checked against its recorded sha256; None when the run recorded none."""
    recorded = run_summary(run_dir).tokenizer
    if not recorded:
        if override is not None:
            raise ExportError(
                f"--tokenizer {override}: {run_dir}'s summary.json records no tokenizer (data.tokenizer "
                "was unset), so there is none to check it against; copy its files into OUT_DIR yourself"
            )
        return None
    directory = Path(override) if override is not None else Path(recorded["path"])
    fixes = (
        "point at the run's tokenizer with --tokenizer DIR (its files must hash to the recorded "
        "sha256), or export the weights alone with --no-tokenizer"
    )
    if not directory.is_dir():
        raise ExportError(
            f"the run's tokenizer {directory} (data.tokenizer, sha256 {recorded['sha256']}) no longer "
            f"exists; {fixes}"
        )
    found = tokenizer_sha256(directory)
    if found != recorded["sha256"]:
        raise ExportError(
            f"the tokenizer in {directory} changed since the run recorded it: its files hash to sha256 "
            f"{found}, the run's tokenizer to {recorded['sha256']} (summary.json); {fixes}"
        )
    identity = tokenizer_identity(directory)
    if recorded.get("eos_token"):
        identity["eos_token"] = recorded["eos_token"]
    return identity


def name_eos_token(folder: Path, token: str) -> bool:
    """Name ``token`` as the end-of-text token of the tokenizer copied into ``folder``, where its
    own files name none: in tokenizer_config.json (made, for transformers' PreTrainedTokenizerFast
    over tokenizer.json, where there is none), which AutoTokenizer reads. Whether it named it."""
    if eos_token(folder) is not None:
        return False
    config_file = folder / TOKENIZER_CONFIG_FILE
    saved = (
        json.loads(config_file.read_text())
        if config_file.is_file()
        else {"tokenizer_class": "PreTrainedTokenizerFast"}
    )
    config_file.write_text(json.dumps({**saved, "eos_token": token}, indent=2) + "\n")
    return True


def check_out_dir(out_dir: Path, *, force: bool) -> None:
    """Refuse an OUT_DIR that holds files, unless ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"OUT_DIR {out_dir} is a file; name a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(
            f"OUT_DIR {out_dir} is not empty; name an empty or new directory, or add --force to replace it"
        )
    if not out_dir.parent.is_dir():
        raise ExportError(f"OUT_DIR {out_dir}: its parent {out_dir.parent} does not exist; create it first")


def export(
    run_dir: Path,
    out_dir: Path,
    *,
    step: int | None = None,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    tokenizer: Path | None = None,
    with_tokenizer: bool = True,
) -> ExportResult:
    """Write the run's checkpoint (the newest, or ``step``'s) as a Hugging Face model in ``out_dir``,
    with the run's tokenizer (or the copy at ``tokenizer``) unless ``with_tokenizer`` is false."""
    check_out_dir(out_dir, force=force)
    cfg = model_config(run_dir)
    record = checkpoint_record(run_dir, step)
    identity = run_tokenizer(run_dir, tokenizer) if with_tokenizer else None
    tag, conversion_peak = _convert_in_child(run_dir, record)
    zero = run_dir / CHECKPOINT_DIR / tag / "zero"
    tensors = hf_shapes(cfg)
    sizes = [(hf, torch.Size(shape).numel() * 4) for hf, (_, shape) in tensors.items()]
    plan = _shard_plan(sizes, max_shard_bytes)
    partial = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        weight_map = _write_shards(partial, zero, tensors, plan)
        if identity is not None:
            for file in tokenizer_files(identity["path"]):
                shutil.copy2(file, partial / file.name)
            if identity.get("eos_token") and name_eos_token(partial, identity["eos_token"]):
                # the copy answers to the run's tokenizer still (runner/data/tokenizer_dir.py tokenizer_shas)
                identity = {**identity, EOS_NAMED_KEY: tokenizer_sha256(partial)}
        _write_config(
            partial,
            cfg,
            run_dir=run_dir,
            record=record,
            weight_map=weight_map,
            sizes=sizes,
            tokenizer=identity,
        )
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _replace(partial, out_dir)
    by_name = dict(sizes)
    return ExportResult(
        out_dir=out_dir,
        tag=record["tag"],
        shards=len(plan),
        tensors=len(sizes),
        largest_shard_bytes=max(sum(by_name[n] for n in shard) for shard in plan),
        largest_tensor_bytes=max(by_name.values()),
        peak_host_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        conversion_peak_host_bytes=conversion_peak,
    )


def _write_shards(
    folder: Path, zero: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], plan: list[list[str]]
) -> dict[str, str]:
    """Write each shard of ``plan`` into ``folder``, one at a time; returns the index's weight_map."""
    # Deferred: only an export needs safetensors (the hf extra, pyproject.toml).
    from safetensors.torch import save_file

    weight_map = {}
    for index, shard in enumerate(plan):
        file = _shard_name(index, len(plan))
        held = {hf: _read_tensor(zero, *tensors[hf]) for hf in shard}
        save_file(held, str(folder / file), metadata={"format": "pt"})
        del held
        weight_map.update(dict.fromkeys(shard, file))
    return weight_map


def _write_config(
    folder: Path,
    cfg: ModelConfig,
    *,
    run_dir: Path,
    record: CheckpointRecord,
    weight_map: dict[str, str],
    sizes: list[tuple[str, int]],
    tokenizer: TokenizerRecord | None,
) -> None:
    """config.json, ladder_export.json (the run, step and tokenizer the files came from; config.json stays
    transformers' own, which model.hf_config reads back), and the index past one shard."""
    config = hf_config_from_model(cfg, dtype="float32")
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    provenance = {
        "run_dir": str(run_dir.resolve()),
        "tag": record["tag"],
        "completed_steps": record["completed_steps"],
        "zero_stage": record["zero_stage"],
        "layout": record["layout"],
        "model": cfg.name,
        "tokenizer": tokenizer,  # its path, sha256 and files, or None: none copied
    }
    (folder / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
    if len(set(weight_map.values())) > 1:
        index = {"metadata": {"total_size": sum(size for _, size in sizes)}, "weight_map": weight_map}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _replace(partial: Path, out_dir: Path) -> None:
    """Rename the finished ``partial`` to ``out_dir``; an old ``out_dir`` (--force) goes after."""
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    if out_dir.exists():
        out_dir.rename(old)
    partial.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _convert_main(argv: list[str]) -> None:
    """The child process: convert RUN_DIR's checkpoint RECORD (JSON) to the universal format."""
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("record")
    args = parser.parse_args(argv)
    try:
        universal_conversion.universal_copy(args.run_dir, json.loads(args.record), model_config(args.run_dir))
    except ValueError as error:  # a refusal: its words alone, as the parent's last line of stderr
        print(error, file=sys.stderr)
        sys.exit(ExitCode.FAILED)


if __name__ == "__main__":
    _convert_main(sys.argv[1:])
