"""This rank's model for its layout, with the same initial weights for a seed in every layout.

runner/model/transformer.py draws each parameter from its own name and the seed, so a rank may build
only what it keeps: its pipeline stage (runner/parallel/pipeline.py), its ZeRO-3 partitions
(runner/engine/zero_init.py) or its tensor-parallel shard (runner/parallel/shard_build.py).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from runner.config import TrainConfig
from runner.engine.zero_init import build_partitioned, held_numel
from runner.hardware.peak_memory import PeakMemory, host_peak_bytes, host_rss_bytes
from runner.layout import Layout
from runner.model.build_method import BY_STAGE, PARTITIONED, SHARD, build_method_for
from runner.model.hf_weights import init_from_record
from runner.model.meta import materialize
from runner.model.transformer import build_model, num_params
from runner.parallel.pipeline import build_pipeline
from runner.parallel.shard_build import build_cut_model, write_initial_weights
from runner.parallel.tensor import split_token_embedding
from runner.rundir.json_types import JsonObject
from runner.rundir.summary_records import ModelBuild


def build_method(config: TrainConfig, layout: Layout) -> str:
    """How this layout builds the model (runner/model/build_method.py)."""
    return build_method_for(zero_stage=config.parallel.zero_stage, tp=layout.tp, pp=layout.pp)


def build_for_layout(
    config: TrainConfig,
    *,
    layout: Layout,
    ds_config: JsonObject,
    device: torch.device,
    mpu: ModuleType | None = None,
) -> nn.Module:
    """This rank's model: its pipeline stage, its ZeRO-3 partitions, its tensor-parallel shard,
    or the whole model. ``mpu``: the sequence-parallel groups, where sp > 1."""
    method = build_method(config, layout)
    dtype = config.precision.name.torch_dtype
    if method == BY_STAGE:
        return build_pipeline(
            config.model,
            pp=layout.pp,
            tp=layout.tp,
            seed=config.seed,
            device=device,
            dtype=dtype,
        )
    if method == SHARD:
        return build_cut_model(
            config.model,
            tp=layout.tp,
            seed=config.seed,
            device=device,
            dtype=dtype,
        )
    if method == PARTITIONED:
        model = build_partitioned(
            config.model, seed=config.seed, ds_config=ds_config, device=device, tp=layout.tp, mpu=mpu
        )
        split_token_embedding(model, tp=layout.tp)
        return model
    if config.model.init_from is not None:  # read, not drawn: no throwaway random weights first
        model = build_model(config.model, device="meta", dtype=dtype)
        materialize(model, device)
        write_initial_weights(model, config.model, seed=config.seed)
        model.init_rope(device)
        return model
    return build_model(config.model, seed=config.seed, device=device, dtype=config.precision.name.torch_dtype)


def _import_build_code(layout: Layout) -> None:
    """Import what a build imports before its memory is measured: code is not the model.

    AutoTP (tp > 1) reads DeepSpeed's AutoEP layer module, which imports Triton's ops where
    torch ships Triton (its CUDA builds): measured with torch 2.11+cu130 on a CPU, a tp 2 shard
    of 51M parameters rose the host 0.177 GB with that import inside the measure, 0.115 GB
    without it (0.115 with the CPU build of torch, which has no Triton).
    """
    if layout.tp > 1:
        import deepspeed.module_inject.auto_ep_layer  # noqa: F401


def build_measured(
    config: TrainConfig,
    *,
    layout: Layout,
    ds_config: JsonObject,
    device: torch.device,
    mpu: ModuleType | None = None,
) -> tuple[nn.Module, ModelBuild]:
    """``build_for_layout``, and what the build cost this rank (summary.json's ``model_build``).

    ``host_peak_gb`` is the rise of the process's high-water RSS over the build (a whole
    model on the host is 4 bytes a parameter in fp32, 2 in bf16 or fp16); ``device_peak_gb``
    the rise of CUDA's allocator peak. Both before DeepSpeed's own copies.
    """
    _import_build_code(layout)
    on_device = PeakMemory(device)
    host = PeakMemory(torch.device("cpu"))
    host.reset()
    on_device.reset()
    host_before, device_before = host_rss_bytes(), on_device.current()
    model = build_for_layout(config, layout=layout, ds_config=ds_config, device=device, mpu=mpu)
    record: ModelBuild = {
        "method": build_method(config, layout),
        "params": held_numel(model),
        "num_params": num_params(config.model),
        "host_peak_gb": (host_peak_bytes() - host_before) / 1e9,
        "device_peak_gb": (on_device.read() - device_before) / 1e9 if device.type == "cuda" else None,
        "init_from": init_from_record(config.model),
    }
    return model, record
