"""A node's host memory in the plan: the whole-model build, ZeRO-3's partitioned build, offload x ranks."""

from __future__ import annotations

import math
from typing import Any

import pytest
from train_helpers import compose_config, plan_json

from launchers.plan_job import plan_job
from runner.config import ModelConfig, Precision, TrainConfig
from runner.layout import resolve_layout
from runner.memory_model.units import GB
from runner.model.build_method import BY_STAGE, DRAW_BLOCK, PARTITIONED, SHARD, WHOLE, build_method_for
from runner.model.transformer import num_params
from runner.parallel.pipeline_split import rank_param_numels
from runner.plan.host import (
    CUDA_RUNTIME,
    CUDA_RUNTIME_BYTES,
    DRAWING,
    INDUCTOR_IMPORT,
    INDUCTOR_IMPORT_BYTES,
    TORCH_RUNTIME_BYTES,
    TRAINING_RUNTIME_BYTES,
    ZERO3_DEFRAGMENT,
    RankBuild,
    build_bytes,
)
from runner.plan.ladder import recommend
from runner.plan.planner import layout_for_config, plan_config, workload_from_config
from runner.report.plan_table import format_plan
from runner.step_time.device_figures import host_ram_bytes

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_cpu_calibration")]

LLAMA_70B_PARAMS = 68_976_648_192  # config.json of meta-llama/Llama-2-70b-hf
LLAMA_70B_EMBEDDING = 32_000 * 8_192  # V x h: its largest tensor (the output head is as large)


def _config(*overrides: str) -> TrainConfig:
    config: TrainConfig = compose_config(*overrides)
    return config


def _h200(*overrides: str) -> TrainConfig:
    return _config("model=llama_70b", "cluster=h200", "batch.global_size=64", *overrides)


@pytest.mark.parametrize(
    ("overrides", "method"),
    [
        (["parallel=ddp"], WHOLE),
        (["parallel=zero2"], WHOLE),
        (["parallel=zero2_offload"], WHOLE),
        (["parallel=zero3"], PARTITIONED),
        (["parallel=zero3_offload"], PARTITIONED),
        (["parallel=zero3", "parallel.tp=2"], PARTITIONED),  # AutoTP then cuts the shards
        (["parallel=tp2"], SHARD),  # cut on the meta device, then allocated
        (["parallel=pp2"], BY_STAGE),
    ],
)
def test_the_planners_build_method_is_the_runners(overrides, method):
    from runner.engine.build import build_method

    config = _config("gpus=2", *overrides)
    par = config.parallel
    layout = resolve_layout(gpus=2, tp=par.tp, pp=par.pp, global_size=16, micro_size=1)
    assert build_method(config, layout) == method
    assert build_method_for(zero_stage=par.zero_stage, tp=par.tp, pp=par.pp) == method


def test_the_build_formulas_match_the_measured_builds_of_a_51m_model_on_2_cpu_ranks():
    """README "How a rank builds the model": whole 0.21 GB, zero.Init, a stage, a shard 0.11 (measured)."""
    model = ModelConfig(d_model=512, n_layer=16, n_head=8, ffn_hidden=1376)
    p = num_params(model)
    largest = 512 * 1376  # w1, w2, w3: larger than the 256 x 512 embedding
    common: dict[str, Any] = dict(precision=Precision.fp32, dp=2, host_is_device=True)
    whole = build_bytes(model, RankBuild(method=WHOLE, **common))
    assert whole == {
        "whole model in fp32": 4 * p,
        DRAWING: 4 * largest,
        "torch runtime": TORCH_RUNTIME_BYTES,
    }
    partitioned = build_bytes(model, RankBuild(method=PARTITIONED, **common))
    assert partitioned == {
        "partitions (fp32, 1/2)": 4 * math.ceil(p / 2),
        "largest module whole (fp32)": 4 * largest,
        DRAWING: 4 * largest // 2,
        "torch runtime": TORCH_RUNTIME_BYTES,
    }
    stage = build_bytes(model, RankBuild(method=BY_STAGE, pp=2, **common))
    # The last stage: 8 of 16 blocks, the final norm and the tied output head (V x h).
    assert stage["largest stage of 2, in fp32"] == 4 * ((p - 512 * 256 - 512) // 2 + 512 + 512 * 256)
    # With tp 2 the stage is cut before it is allocated: its rank's shard only (each block
    # matrix and the vocabulary halved, the norms whole).
    cut = build_bytes(model, RankBuild(method=BY_STAGE, pp=2, tp=2, **common))
    shard = cut["largest stage of 2, 1/2 of it, in fp32"]
    assert shard == 4 * sum(rank_param_numels(model, tp=2, pp=2))
    assert 0.5 < shard / stage["largest stage of 2, in fp32"] < 0.51
    measured = {WHOLE: 0.213, PARTITIONED: 0.115, BY_STAGE: 0.115, SHARD: 0.114}
    planned = {WHOLE: whole, PARTITIONED: partitioned, BY_STAGE: stage, SHARD: shard_build(model, common)}
    for method, lines in planned.items():
        # The rise over a build leaves out the process it started in (the "torch runtime" line).
        built = (sum(lines.values()) - TORCH_RUNTIME_BYTES) / GB
        assert built == pytest.approx(measured[method], abs=0.015), (method, built)


def shard_build(model: ModelConfig, common: dict) -> dict[str, int]:
    """The host lines of a tp 2 shard built on 2 CPU ranks (2 ranks: dp 1)."""
    return build_bytes(model, RankBuild(method=SHARD, tp=2, **{**common, "dp": 1}))


def test_zero2_builds_on_the_gpu_and_the_host_draws_one_parameter_at_a_time():
    plan = plan_config(_h200("parallel=zero2", "gpus=64"))
    host = plan.host
    assert host.ranks_per_node == 8 and host.build_method == WHOLE
    assert host.build == {
        DRAWING: 4 * DRAW_BLOCK,  # the 262M-element embedding, 64M elements at a time
        "torch runtime": TORCH_RUNTIME_BYTES,
    }
    # Training, the rank's process holds CUDA's host side (measured on an H200) beside torch's.
    assert host.steady == {CUDA_RUNTIME: CUDA_RUNTIME_BYTES, "torch runtime": TRAINING_RUNTIME_BYTES}
    assert host.phase == "steady" and host.fits
    assert "host FITS, 1785.0 GB to spare: 8 ranks x 1.88 GB training (steady)" in format_plan(plan)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zero2_at_tp_8_on_64_h200s_builds_each_shard_on_its_gpu(precision):
    """Cut on the meta device first (runner/parallel/shard_build.py): the host only draws initial values.

    When AutoTP cut a whole model built in host memory, this was 8 x 276.3 GB = 2210.1 GB per
    node in fp32, more than a DGX H200's 2 TB.
    """
    plan = plan_config(_h200("parallel=zero2", "parallel.tp=8", "gpus=64", f"precision={precision}"))
    host = plan.host
    assert host.ranks_per_node == 8 and host.build_method == SHARD
    assert host.build == {DRAWING: 4 * DRAW_BLOCK, "torch runtime": TORCH_RUNTIME_BYTES}
    assert host.build_per_node == 8 * (4 * DRAW_BLOCK + TORCH_RUNTIME_BYTES)  # 4.15 GB
    assert host.phase == "steady" and host.fits  # CUDA's 1.55 GB outweighs the drawing
    assert "host FITS, 1785.0 GB to spare: 8 ranks x 1.88 GB training (steady)" in format_plan(plan)


def test_cpu_ranks_build_their_tensor_parallel_shard_in_host_memory():
    """Where the CPU is the device, the shard is host memory: 1/tp of each matrix and of the vocabulary."""
    plan = plan_config(
        _config("model=llama_1b", "gpus=2", "parallel=zero2", "parallel.tp=2", "precision=bf16")
    )
    shard = plan.host.build["1/2 of the model, in bf16"]
    assert shard == 2 * sum(rank_param_numels(plan.workload.model, tp=2))
    assert 0.5 < shard / (2 * plan.workload.num_params) < 0.51  # the norms stay whole


def test_zero3_builds_partitioned_on_the_gpus_and_fits_the_host():
    plan = plan_config(_h200("parallel=zero3", "gpus=64"))
    host = plan.host
    assert host.build_method == PARTITIONED
    # zero.Init creates each module on the GPU: the host draws one partition at a time.
    assert host.build == {
        DRAWING: 4 * math.ceil(LLAMA_70B_EMBEDDING / 64),
        "torch runtime": TORCH_RUNTIME_BYTES,
    }
    assert host.fits and host.build_per_node < 3 * GB
    # The rank's process: CUDA's host side, torch, DeepSpeed and torch._dynamo
    # (runner/engine/fixes/muon_compiles_at_import.py
    # keeps Inductor out); and its fp32 partition once more, which DeepSpeed's engine start copies
    # through the host (runtime/zero/utils.py defragment).
    assert host.steady == {
        CUDA_RUNTIME: CUDA_RUNTIME_BYTES,
        ZERO3_DEFRAGMENT: 4 * math.ceil(LLAMA_70B_PARAMS / 64),
        "torch runtime": TRAINING_RUNTIME_BYTES,
    }
    assert "host FITS, 1750.5 GB to spare: 8 ranks x 6.19 GB training (steady)" in format_plan(plan)


def test_zero3_offload_keeps_8_ranks_offloaded_states_on_one_node():
    plan = plan_config(_h200("parallel=zero3_offload", "gpus=8"))
    host, memory = plan.host, plan.memory
    partition = math.ceil(LLAMA_70B_PARAMS / 8)
    # fp32 Adam, params + optimizer offloaded: params 4, grads 4, m and v 8, fp32 master copy 4,
    # the stage-3 gradient partitions 4 bytes per element of the partition (runner/memory.py).
    assert sum(memory.host.values()) == 24 * partition
    # The parameters live on the host: no defragment pass through it.
    process = {CUDA_RUNTIME: CUDA_RUNTIME_BYTES, "torch runtime": TRAINING_RUNTIME_BYTES}
    assert host.steady == {**memory.host, **process}
    assert host.steady_per_node == 8 * (24 * partition + sum(process.values()))  # 1670.5 GB
    # Building, the fp32 partitions land on the host too (offload_param), but no more than that.
    assert host.build["partitions (fp32, 1/8)"] == 4 * partition
    assert host.phase == "steady" and host.fits
    table = format_plan(plan)
    assert "steady: offloaded and host buffers        206.93" in table
    assert "host FITS, 129.5 GB to spare: 8 ranks x 208.8 GB training (steady) = 1670.5 GB" in table


def test_offload_that_the_host_cannot_hold_names_the_fixes():
    plan = plan_config(_h200("parallel=zero3_offload", "gpus=8", "cluster.host_memory_gb=1000"))
    assert not plan.host.fits and plan.fits  # the device holds it; the node's RAM does not
    table = format_plan(plan)
    assert "host DOES NOT FIT by 770.5 GB: 8 ranks x 208.8 GB training (steady)" in table
    assert "fix: parallel.offload_param=none keeps the 16-bit parameters on the device" in table
    assert "fix: fewer ranks per node: 4 fit" in table


def test_a_named_clusters_own_figures_are_its_datasheets_and_an_override_is_config():
    device = plan_config(_h200("cluster.peak_tflops_bf16=500", "precision=bf16")).workload.device
    assert device.memory_bytes.source == "datasheet: cluster h200"
    assert device.host_memory_bytes.source == "datasheet: cluster h200"
    assert device.peak_flops.source == "config: cluster.peak_tflops_bf16, over cluster h200's datasheet 989"


def test_ranks_per_node_is_gpus_up_to_the_node():
    assert plan_config(_h200("parallel=zero2", "gpus=4")).host.ranks_per_node == 4


def test_the_default_tiny_run_on_this_host():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks a CPU host, where the host is the device")
    plan = plan_config(_config())
    host = plan.host
    ram, how = host_ram_bytes()
    assert host.ram_bytes == ram and how in host.ram_source
    assert host.ranks_per_node == 1 and host.build_method == WHOLE
    runtime = TRAINING_RUNTIME_BYTES
    assert host.steady == {"device total (CPU ranks)": plan.memory.total, "torch runtime": runtime}
    assert host.build["whole model in fp32"] == 4 * plan.workload.num_params
    assert host.fits
    assert "host FITS" in format_plan(plan)


def test_the_ladder_skips_layouts_whose_host_cannot_hold_them():
    """llama_70b in bf16 fits 8 H200s only with ZeRO-3 offloading: 8 x 174.3 GB of host RAM per
    node, which a DGX's 2 TB holds and 1 TB does not."""

    def ladder(*overrides: str):
        config = _config("model=llama_70b", "cluster=h200", "gpus=8", "precision=bf16", *overrides)
        return recommend(workload_from_config(config))

    default = ladder()
    assert next(rung for rung in default.rungs if rung.fits).name == "zero3 + offload optimizer"
    # Nothing without offload fits, so the offloaded layouts are ranked (planner.recommend's rule).
    assert default.winner is not None and default.winner.plan.knobs.spec.offload.value != "none"
    small = ladder("cluster.host_memory_gb=1000")
    offload = next(rung for rung in small.rungs if rung.name == "zero3 + offload optimizer")
    assert offload.plan.fits and not offload.plan.host.fits and not offload.fits
    host = "but the host: 1394.6 GB per node steady (8 x 174.3 GB) > 900.0 GB usable host RAM"
    assert host in offload.reason
    assert small.winner is None


def test_a_run_is_not_refused_for_host_memory_as_it_is_not_for_device_memory():
    """The plan's host verdict is advice: the runner plans device memory (and, by speed, the step)
    only to choose micro_size=auto."""
    config = _config("cluster.host_memory_gb=0.001", "cluster.gpus_per_node=1", "planner.objective=memory")
    choice = layout_for_config(config)
    assert choice.layout.micro_size == 8 and choice.reason is not None


def test_plan_json_has_the_host_lines(tmp_path, capsys):
    plan_job(_h200("parallel=zero3_offload", "gpus=8", "cluster.host_memory_gb=1000"), run_dir=tmp_path)
    host = plan_json(tmp_path)["host_memory"]
    assert host["ranks_per_node"] == 8 and host["build_method"] == PARTITIONED
    assert host["per_rank"]["build"]["partitions (fp32, 1/8)"] == 4 * math.ceil(LLAMA_70B_PARAMS / 8)
    assert host["per_node"]["peak_phase"] == "steady"
    assert host["per_node"]["peak"] == host["per_node"]["steady"]
    assert host["ram_bytes"] == 1000 * GB
    assert host["ram_source"] == "config: cluster.host_memory_gb, over cluster h200's datasheet 2000"
    assert host["fits"] is False and host["margin_bytes"] < 0
    assert any(fix.startswith("parallel.offload_param=none") for fix in host["fixes"])
    assert "host memory per node" in capsys.readouterr().out


@pytest.mark.parametrize("compiled", [False, True])
def test_torchinductor_is_counted_where_the_run_compiles(compiled):
    """train.compile imports TorchInductor on every rank; without it no rank does, ZeRO included
    (DeepSpeed's Muon module is imported without compiling,
    runner/engine/fixes/muon_compiles_at_import.py)."""
    overrides = ("parallel=zero3", "gpus=2", "precision=bf16", f"train.compile={str(compiled).lower()}")
    steady = plan_config(_config(*overrides)).host.steady
    assert (INDUCTOR_IMPORT in steady) is compiled
    assert steady.get(INDUCTOR_IMPORT, 0) == (INDUCTOR_IMPORT_BYTES if compiled else 0)


@pytest.mark.parametrize(
    ("model", "parallel", "measured_gb"),
    [("llama_1b", "ddp", 1.880), ("llama_1b", "zero3", 3.679), ("llama_7b", "zero3", 14.688)],
)
def test_a_gpu_ranks_host_plan_holds_what_one_h200_measured(model, parallel, measured_gb):
    """The rank's high-water RSS in bench/gpu_check.sh on one H200 (docs/benchmarks.md, 2026-12-04).

    Before CUDA's host side and ZeRO-3's defragment were counted the plan said 0.52 GB for all three.
    ZeRO-3's line is an upper bound: at the engine's start CUDA's libraries are not all loaded yet.
    """
    plan = plan_config(
        _config(
            f"model={model}",
            f"parallel={parallel}",
            "cluster=h200",
            "gpus=1",
            "precision=bf16",
            "data=synthetic",
            "data.seq_len=2048",
            "batch.global_size=16",
        )
    )
    planned_gb = plan.host.peak_per_rank / GB
    assert measured_gb <= planned_gb <= 1.2 * measured_gb
