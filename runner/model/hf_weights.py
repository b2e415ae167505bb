"""``model.init_from=DIR``: a Hugging Face safetensors directory (or ``ladder export``'s) as the
initial weights, each rank reading only the slice it holds.

Every build writes a parameter's initial values through :func:`write_values` (a flat range:
the whole tensor, or a ZeRO-3 partition, runner/engine/zero_init.py) or :func:`write_shard`
(a tensor-parallel shard, runner/parallel/shard_build.py). Without ``init_from`` they draw
runner/model/transformer.py's seeded values; with it they read the same elements from the
files with safetensors' ``get_slice``, which reads the rows asked for and no more, in bands
of about DRAW_BLOCK elements: a ZeRO-3 rank reads its partition and no more than zero.Init
would draw.

:func:`init_from_problems` checks names and shapes against the files' headers (no tensor is
read) before any rank starts.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from runner.config import ModelConfig
from runner.model.build_method import DRAW_BLOCK
from runner.model.hf_names import hf_name, hf_shapes
from runner.model.transformer import write_initial_shard, write_initial_values
from runner.rundir.summary_records import InitFromRecord

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Buffers older transformers saved beside the weights; derived from the config, never trained.
_DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)


def _safe_open() -> Any:
    """safetensors' ``safe_open``, imported where init_from is used: the hf extra (pyproject.toml)."""
    # Deferred: a run without model.init_from needs no safetensors installed.
    from safetensors import safe_open

    return safe_open


@functools.lru_cache(maxsize=4)
def weight_files(folder: str) -> dict[str, str]:
    """Each tensor's safetensors file in ``folder``, by name (from the index, or the one file)."""
    safe_open = _safe_open()
    root = Path(folder)
    if (root / INDEX_FILE).is_file():
        weight_map: dict[str, str] = json.loads((root / INDEX_FILE).read_text())["weight_map"]
        return {name: str(root / file) for name, file in weight_map.items()}
    if (root / SINGLE_FILE).is_file():
        with safe_open(str(root / SINGLE_FILE), framework="pt") as handle:
            return dict.fromkeys(handle.keys(), str(root / SINGLE_FILE))
    raise ValueError(f"{folder} holds neither {INDEX_FILE} nor {SINGLE_FILE}")


# Bytes per element of each safetensors dtype (the format's own names).
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip


def init_from_record(cfg: ModelConfig) -> InitFromRecord | None:
    """summary.json's ``model_build.init_from``: the directory the weights were read from, the
    tensors the model took from it and their bytes in its files (from the headers); None without
    ``model.init_from``."""
    if cfg.init_from is None:
        return None
    needed = hf_shapes(cfg)
    by_file: dict[str, list[str]] = {}
    for name, file in weight_files(cfg.init_from).items():
        if name in needed:
            by_file.setdefault(file, []).append(name)
    total = 0
    for file, names in by_file.items():
        with _safe_open()(file, framework="pt") as handle:
            for name in names:
                piece = handle.get_slice(name)
                total += math.prod(piece.get_shape()) * SAFETENSORS_DTYPE_BYTES.get(piece.get_dtype(), 0)
    return {
        "path": str(Path(cfg.init_from).resolve()),
        "tensors": sum(len(names) for names in by_file.values()),
        "bytes": total,
    }


def header_shapes(folder: str) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in ``folder``'s safetensors files, read from their headers only."""
    safe_open = _safe_open()
    shapes = {}
    by_file: dict[str, list[str]] = {}
    for name, file in weight_files(folder).items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as handle:
            for name in names:
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def init_from_problems(cfg: ModelConfig) -> list[str]:
    """Why ``cfg.init_from``'s tensors cannot start ``cfg``'s model: the missing, misshapen and
    unexpected tensors, a line for each kind with the first few, both shapes, the count and the
    fix; empty when they can."""
    key = f"model.init_from={cfg.init_from}"
    if cfg.init_from is None:
        return []
    if not Path(cfg.init_from).is_dir():
        return [f"{key}: not a directory; name a Hugging Face model directory (config.json, *.safetensors)"]
    try:
        found = header_shapes(cfg.init_from)
    except (ValueError, OSError) as error:
        return [f"{key}: {error}; name a directory of safetensors files, as save_pretrained writes"]
    fix = "set the model's shape from the same directory (model=hf model.hf_config=DIR)"
    expected = hf_shapes(cfg)
    missing = [
        f"no tensor {hf}, which this model needs with shape {shape}"
        for hf, (_, shape) in expected.items()
        if hf not in found
    ]
    misshapen = [
        f"{hf} has shape {found[hf]}, this model's {shape}"
        for hf, (_, shape) in expected.items()
        if hf in found and found[hf] != shape
    ]
    placeless = [
        f"{extra} {found[extra]} has no place in this model (model.tie_embeddings={cfg.tie_embeddings}, "
        f"model.qkv_bias={cfg.qkv_bias})"
        for extra in sorted(set(found) - set(expected))
        if not extra.endswith(_DERIVED_SUFFIXES)
    ]
    return [
        *_grouped(key, missing, "missing", fix),
        *_grouped(key, misshapen, "of other shapes", fix),
        *_grouped(key, placeless, "without a place", fix),
    ]


# Tensors named in one refusal line, of each kind: a whole model of another shape would otherwise
# print one line per tensor (hundreds for an 8B model), each with the same fix.
SHOWN_TENSORS = 3


def _grouped(key: str, found: list[str], kind: str, fix: str) -> list[str]:
    """One refusal line for the tensors ``found`` of one kind: the first few, the count, the fix."""
    if not found:
        return []
    more = f" (and {len(found) - SHOWN_TENSORS} more tensors {kind})" if len(found) > SHOWN_TENSORS else ""
    return [f"{key}: {'; '.join(found[:SHOWN_TENSORS])}{more}; {fix}"]


def _rows(cfg: ModelConfig, name: str, top: int, bottom: int) -> torch.Tensor:
    """Rows [top, bottom) of ladder parameter ``name`` (the elements, for a vector), fp32."""
    assert cfg.init_from is not None
    hf = hf_name(name)
    with _safe_open()(weight_files(cfg.init_from)[hf], framework="pt") as handle:
        return handle.get_slice(hf)[top:bottom].float()


@torch.no_grad()
def write_values(
    out: torch.Tensor, cfg: ModelConfig, name: str, shape: Sequence[int], *, seed: int, start: int = 0
) -> None:
    """Write elements [start, start + out.numel()) of parameter ``name``'s initial value into ``out``:
    read from ``cfg.init_from``, or drawn for ``seed`` (runner/model/transformer.py
    ``write_initial_values``) without it."""
    if cfg.init_from is None:
        write_initial_values(out, cfg, name, shape, seed=seed, start=start)
        return
    flat = out.view(-1)
    stop = start + flat.numel()
    row = math.prod(shape[1:])  # elements of one row (1 for a vector)
    band = max(1, DRAW_BLOCK // row)
    top = start // row
    while top * row < stop:
        bottom = min(top + band, -(-stop // row))
        values = _rows(cfg, name, top, bottom).reshape(-1)
        a, b = max(start, top * row), min(stop, bottom * row)
        flat[a - start : b - start].copy_(values[a - top * row : b - top * row])
        top = bottom


@torch.no_grad()
def write_shard(
    out: torch.Tensor,
    cfg: ModelConfig,
    name: str,
    shape: Sequence[int],
    *,
    seed: int,
    dim: int,
    start: int,
) -> None:
    """Write a tensor-parallel shard (``out`` is [start, start + out.shape[dim]) along ``dim``)
    of parameter ``name``'s initial value: read from ``cfg.init_from``, or drawn for ``seed``
    (runner/model/transformer.py ``write_initial_shard``) without it."""
    if cfg.init_from is None:
        write_initial_shard(out, cfg, name, shape, seed=seed, dim=dim, start=start)
        return
    if dim == 0:
        write_values(out, cfg, name, shape, seed=seed, start=start * math.prod(shape[1:]))
        return
    hf = hf_name(name)
    band = max(1, DRAW_BLOCK // shape[1])
    with _safe_open()(weight_files(cfg.init_from)[hf], framework="pt") as handle:
        view = handle.get_slice(hf)
        for top in range(0, shape[0], band):
            bottom = min(shape[0], top + band)
            out[top:bottom].copy_(view[top:bottom, start : start + out.shape[1]].float())
