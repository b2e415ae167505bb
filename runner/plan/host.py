"""Host memory per node of one layout: what a node's RAM holds while the model is built, and after.

The device check (runner/plan/planner.py) sizes one GPU. A node's host RAM is shared by all the
ranks the node runs, ``ranks_per_node = min(gpus, gpus_per_node)``, and can run out
before any GPU does, in two phases that do not overlap:

- **build** (runner/engine/build.py ``build_method``): ZeRO 0-2 build the whole model in the
  parameters' dtype (2 bytes x P in bf16 or fp16, 4 in fp32) on the device it trains on,
  so the host holds it only where the CPU is the device; with tensor parallelism only the
  rank's shard, cut on the meta device before anything is allocated
  (runner/parallel/shard_build.py). ZeRO-3 builds
  under ``zero.Init`` (runner/engine/zero_init.py; with tensor parallelism over each rank's
  data-parallel group, AutoTP then cutting the shards on the device: runner/memory_model/peak.py
  ``zero3_tp_build_bytes``), which creates each module on the device in the model dtype and
  partitions it as its constructor returns (DeepSpeed 0.19.8
  runtime/zero/partition_parameters.py: tensors on ``local_device``, partitions on
  ``remote_device``, the host only with ``offload_param``): the host keeps the partitions
  only with parameter offload, and one module whole only when the CPU is the device. A
  pipeline rank builds its own stage (runner/parallel/pipeline_split.py ``stage_param_numels``) in
  the parameters' dtype on its device, on the host only where the CPU is the device; with
  tensor parallelism it is cut on the meta device first, so only its shard is ever
  allocated (runner/parallel/pipeline_tensor.py). Every
  rank also draws its initial values on the host in fp32, one parameter (or one
  partition of it) at a time and at most ``DRAW_BLOCK`` elements of it (runner/model/transformer.py
  ``write_initial_values``).
- **steady** (from DeepSpeed's engine on): ZeRO-Offload's offloaded terms and its own
  host buffers per rank (runner/memory.py ``model_states``, ``offload_host_buffers``:
  the plan's "offloaded ..." and "host buffer: ..." lines); when the model lives on a
  GPU, CUDA's host side and ZeRO-3's defragment (below); everything on CPU ranks, where
  the host is the device.

Both phases count each rank's process as it stands before any tensor: Python with torch
and DeepSpeed imported, 0.25 GB measured on a CPU (torch 2.13, DeepSpeed 0.19.8), and from
the engine on also torch._dynamo, which torch.optim imports at the first optimizer: 0.33 GB,
and 0.044 GB more where the run compiles its blocks (``train.compile``), which imports
TorchInductor; a GPU rank also holds CUDA's host side, 1.55 GB measured on an H200
(``CUDA_RUNTIME_BYTES``), and under ZeRO-3 without parameter offload its parameter partition
once more as the engine starts (``ZERO3_DEFRAGMENT``), which the steady phase counts with
the rest: an upper bound, as CUDA's libraries are not all loaded yet then. The node fits when the larger
phase, times the ranks per node, is at most ``planner.headroom`` x the node's RAM (the same
headroom as the device check). Against the measured build rises of a 51M-parameter model on 2 CPU ranks
(README: whole 0.21 GB, zero.Init, a stage and a tp 2 shard 0.11 GB each) the build lines
without the process give 0.21, 0.11 and 0.11 GB.

Units: bytes inside, decimal GB (1e9) in the messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from runner.config import ModelConfig, OffloadPlacement, Precision, ZeroStage
from runner.layout import Layout
from runner.memory_model.peak import MemoryTerms
from runner.memory_model.units import FP32_BYTES
from runner.model.build_method import (
    BY_STAGE,
    DRAW_BLOCK,
    PARTITIONED,
    SHARD,
    WHOLE,
    build_method_for,
)
from runner.model.shape import num_params as count_params
from runner.model.shape import param_numels
from runner.parallel.pipeline_split import rank_param_numels
from runner.step_time.workload import Knobs, Workload

GB = 1e9  # decimal gigabyte, as runner/plan/planner.py
DRAWING = "drawing initial values (fp32)"
# A rank's process before any tensor: the high-water RSS of `import torch, deepspeed` on a CPU
# while it builds the model, and once it has an optimizer, whose first construction imports
# torch._dynamo (torch/optim/optimizer.py, through torch._disable_dynamo): measured 0.252
# and 0.329 GB (torch 2.13, DeepSpeed 0.19.8).
TORCH_RUNTIME_BYTES = 250_000_000
TRAINING_RUNTIME_BYTES = 330_000_000
# TorchInductor's compiler, imported where the run compiles its blocks (train.compile): 0.044 GB
# more high-water RSS on top of the training runtime (0.366 against 0.322 GB, torch 2.13,
# DeepSpeed 0.19.8, measured as DeepSpeed's Muon module imported it; ladder's ranks import that
# module without compiling since, runner/engine/fixes/muon_compiles_at_import.py).
INDUCTOR_IMPORT_BYTES = 44_000_000
INDUCTOR_IMPORT = "TorchInductor import"  # the plan's line; see INDUCTOR_IMPORT_BYTES
# CUDA's host side of a GPU rank: the driver's context and the host memory of the libraries torch
# loads as training starts (cuBLAS, cuDNN, NCCL). Measured as a GPU rank's high-water RSS less
# TRAINING_RUNTIME_BYTES: llama_1b in bf16 under ddp on one H200, 1.88 GB (torch 2.11+cu130,
# CUDA 13.0, DeepSpeed 0.19.8; docs/benchmarks.md, bench/gpu_check.sh 2026-12-04).
CUDA_RUNTIME_BYTES = 1_550_000_000
CUDA_RUNTIME = "CUDA context and libraries"  # the plan's line; see CUDA_RUNTIME_BYTES
# ZeRO-3 without parameter offload moves the rank's parameter partitions (16-bit, or fp32) into
# one flat device buffer through a host buffer of their size as the engine starts (DeepSpeed 0.19.8
# runtime/zero/utils.py ``defragment``, called from runtime/zero/stage3.py): a GPU rank's host
# holds its whole partition once. Measured on one H200: llama_1b and llama_7b under ZeRO-3 rose
# the rank's high-water RSS to 3.68 and 14.69 GB, 1.21 GB plus 2 bytes a parameter each.
ZERO3_DEFRAGMENT = "ZeRO-3 partition via host"  # DeepSpeed's defragment, at engine start


def _gb(num_bytes: float) -> str:
    """Decimal GB with the unit; two decimals below 10 GB (a rank's share of a small model)."""
    return f"{num_bytes / GB:.{1 if num_bytes >= 10 * GB else 2}f} GB"


def largest_stage_params(model: ModelConfig, pp: int, tp: int = 1) -> int:
    """Parameters of the fullest pipeline stage's rank (runner/parallel/pipeline_split.py: DeepSpeed's
    balance; with tp, its shard)."""
    return sum(rank_param_numels(model, tp=tp, pp=pp))


@dataclass(frozen=True)
class RankBuild:
    """How one rank builds its model (runner/engine/build.py): the method, the dtype, its share."""

    method: str  # runner.model.build_method: WHOLE, SHARD, BY_STAGE or PARTITIONED
    precision: Precision
    dp: int
    tp: int = 1
    pp: int = 1
    host_is_device: bool = False  # CPU ranks: the host holds what a GPU would
    params_offloaded: bool = False  # ZeRO-3's parameter offload keeps the partitions on the host


def build_bytes(model: ModelConfig, build: RankBuild) -> dict[str, int]:
    """Named host bytes one rank holds at the peak of building its model (see the module docstring).

    The model's largest parameter tensor (the embedding or output head, V x h, for the models
    here) bounds what is drawn at once; under zero.Init it is the largest module whole.
    """
    method, dp, tp, pp, host_is_device = build.method, build.dp, build.tp, build.pp, build.host_is_device
    num_params, largest_param = count_params(model), max(param_numels(model))
    lines: dict[str, int] = {}
    p = Precision(build.precision).bytes  # one parameter as the model holds it
    dtype = Precision(build.precision).value  # as the lines name it
    if method == WHOLE:
        if host_is_device:
            lines[f"whole model in {dtype}"] = p * num_params
        lines[DRAWING] = FP32_BYTES * min(largest_param, DRAW_BLOCK)
    elif method == SHARD:
        if host_is_device:
            lines[f"1/{tp} of the model, in {dtype}"] = p * sum(rank_param_numels(model, tp=tp))
        # A row-parallel shard is cut from bands of whole rows, DRAW_BLOCK elements at a time.
        lines[DRAWING] = FP32_BYTES * min(largest_param, DRAW_BLOCK)
    elif method == BY_STAGE:
        if host_is_device:
            stage = f"largest stage of {pp}" + (f", 1/{tp} of it" if tp > 1 else "")
            lines[f"{stage}, in {dtype}"] = p * largest_stage_params(model, pp, tp)
        lines[DRAWING] = FP32_BYTES * min(largest_param, DRAW_BLOCK)
    elif method == PARTITIONED:
        # zero.Init creates tensors in the model dtype (partition_parameters.py ``self.dtype``).
        if host_is_device or build.params_offloaded:
            lines[f"partitions ({dtype}, 1/{dp})"] = p * -(-num_params // dp)
        if host_is_device:
            lines[f"largest module whole ({dtype})"] = p * largest_param
        lines[DRAWING] = FP32_BYTES * min(-(-largest_param // dp), DRAW_BLOCK)
    else:
        known = ", ".join(repr(m) for m in (WHOLE, SHARD, PARTITIONED, BY_STAGE))
        raise ValueError(f"build method {method!r} is not one of {known}")
    lines["torch runtime"] = TORCH_RUNTIME_BYTES
    return lines


@dataclass(frozen=True)
class HostMemory:
    """A node's host memory for one layout: each phase per rank, times the ranks, against the RAM."""

    ranks_per_node: int
    build_method: str
    steady: dict[str, int]  # per rank, named
    build: dict[str, int]  # per rank, named
    ram_bytes: float
    ram_source: str
    headroom: float
    fixes: list[str] = field(default_factory=list)  # when it does not fit: what would

    @property
    def steady_per_node(self) -> int:
        """Bytes a node holds while training: ranks x the steady lines."""
        return self.ranks_per_node * sum(self.steady.values())

    @property
    def build_per_node(self) -> int:
        """Bytes a node holds at the peak of building: ranks x the build lines."""
        return self.ranks_per_node * sum(self.build.values())

    @property
    def phase(self) -> str:
        """The phase that needs more host memory: 'build' or 'steady'."""
        return "build" if self.build_per_node >= self.steady_per_node else "steady"

    @property
    def peak_per_node(self) -> int:
        """The larger phase's bytes per node."""
        return max(self.build_per_node, self.steady_per_node)

    @property
    def peak_per_rank(self) -> int:
        """The larger phase's bytes per rank."""
        return self.peak_per_node // self.ranks_per_node

    @property
    def usable_bytes(self) -> float:
        """Host bytes a node may use: headroom x its RAM."""
        return self.headroom * self.ram_bytes

    @property
    def fits(self) -> bool:
        """True when the larger phase fits the usable host RAM."""
        return self.peak_per_node <= self.usable_bytes

    def verdict(self) -> str:
        """One line: FITS with the spare bytes, or DOES NOT FIT with the arithmetic."""
        what = "building the model" if self.phase == "build" else "training (steady)"
        ranks = f"{self.ranks_per_node} rank{'s' if self.ranks_per_node > 1 else ''}"
        arithmetic = f"{ranks} x {_gb(self.peak_per_rank)} {what}"
        if self.fits:
            return (
                f"host FITS, {_gb(self.usable_bytes - self.peak_per_node)} to spare: {arithmetic} = "
                f"{_gb(self.peak_per_node)} of {_gb(self.usable_bytes)} usable host RAM per node"
            )
        return (
            f"host DOES NOT FIT by {_gb(self.peak_per_node - self.usable_bytes)}: {arithmetic} = "
            f"{_gb(self.peak_per_node)} > {_gb(self.usable_bytes)} usable host RAM per node"
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (bytes) for plan.json."""
        return {
            "ranks_per_node": self.ranks_per_node,
            "build_method": self.build_method,
            "per_rank": {"build": dict(self.build), "steady": dict(self.steady)},
            "per_node": {
                "build": self.build_per_node,
                "steady": self.steady_per_node,
                "peak": self.peak_per_node,
                "peak_phase": self.phase,
            },
            "ram_bytes": self.ram_bytes,
            "ram_source": self.ram_source,
            "headroom": self.headroom,
            "usable_bytes": self.usable_bytes,
            "fits": self.fits,
            "margin_bytes": self.usable_bytes - self.peak_per_node,
            "fixes": list(self.fixes),
        }


def _fixes(
    *,
    offload: OffloadPlacement,
    phase: str,
    peak_per_rank: int,
    ranks_per_node: int,
    usable: float,
    headroom: float,
) -> list[str]:
    """What would make a node's host memory fit, cheapest first, each with its number.

    On a GPU every build method allocates on the device, the host holding at most 256 MB
    of drawn initial values per rank (with parameter offload, the partitions it keeps
    after anyway); on CPU ranks training holds everything the build did and more. So a
    node's RAM runs out in the steady phase: ZeRO-Offload's states, ZeRO-3's partition
    passing through the host, or CUDA's 1.55 GB per rank: fewer ranks per node, more
    nodes or a larger host.
    """
    fixes = []
    if phase == "steady" and offload == OffloadPlacement.optimizer_and_params:
        fixes.append("parallel.offload_param=none keeps the 16-bit parameters on the device")
    if phase == "steady" and offload != OffloadPlacement.none:
        fixes.append("more nodes: each rank's offloaded partition shrinks as 1/dp")
    per_node = int(usable // peak_per_rank) if peak_per_rank else ranks_per_node
    if 1 <= per_node < ranks_per_node:
        fixes.append(
            f"fewer ranks per node: {per_node} fit ({per_node} x {_gb(peak_per_rank)}); "
            f"plan it with cluster.gpus_per_node={per_node}"
        )
    need_gb = math.ceil(ranks_per_node * peak_per_rank / headroom / GB)
    fixes.append(f"a larger host: {need_gb} GB of RAM per node (cluster.host_memory_gb={need_gb})")
    return fixes


def _steady_bytes(workload: Workload, knobs: Knobs, layout: Layout, memory: MemoryTerms) -> dict[str, int]:
    """Named host bytes one rank holds from DeepSpeed's engine on (see the module docstring)."""
    # CPU ranks hold every device byte in host memory; GPU ranks what they offload, CUDA's host
    # side and, under ZeRO-3 keeping its parameters on the GPU, one pass of them through the host.
    if memory.host_counts_on_device:
        steady = {"device total (CPU ranks)": memory.total}
    else:
        steady = {**memory.host, CUDA_RUNTIME: CUDA_RUNTIME_BYTES}
        if (
            knobs.spec.zero_stage is ZeroStage.zero3
            and knobs.spec.offload != OffloadPlacement.optimizer_and_params
        ):
            model, tp = workload.model, layout.tp
            rank_params = workload.num_params if tp == 1 else sum(rank_param_numels(model, tp=tp))
            steady[ZERO3_DEFRAGMENT] = workload.precision.bytes * -(-rank_params // layout.zero_ranks)
    steady["torch runtime"] = TRAINING_RUNTIME_BYTES
    if workload.compiled:
        steady[INDUCTOR_IMPORT] = INDUCTOR_IMPORT_BYTES
    return steady


def host_memory(workload: Workload, knobs: Knobs, layout: Layout, memory: MemoryTerms) -> HostMemory:
    """A node's host memory for this layout (see the module docstring).

    ``memory``: the device's terms (runner/memory_model/peak.py), whose ``host`` lines are each
    rank's offloaded terms and DeepSpeed's host buffers, and whose total CPU ranks hold in
    host memory.
    """
    ranks = max(1, min(layout.gpus, workload.device.per_node))
    method = build_method_for(zero_stage=knobs.spec.zero_stage, tp=layout.tp, pp=layout.pp)
    build = build_bytes(
        workload.model,
        RankBuild(
            method=method,
            precision=workload.precision,
            dp=layout.zero_ranks,
            tp=layout.tp,
            pp=layout.pp,
            host_is_device=memory.host_counts_on_device,
            params_offloaded=knobs.spec.offload == OffloadPlacement.optimizer_and_params,
        ),
    )
    steady = _steady_bytes(workload, knobs, layout, memory)
    ram = workload.device.host_memory_bytes
    ram_bytes, headroom = float(ram.value or 0.0), workload.headroom
    memory_per_node = HostMemory(ranks, method, steady, build, ram_bytes, ram.source, headroom)
    if memory_per_node.fits:
        return memory_per_node
    fixes = _fixes(
        offload=knobs.spec.offload,
        phase=memory_per_node.phase,
        peak_per_rank=memory_per_node.peak_per_rank,
        ranks_per_node=ranks,
        usable=memory_per_node.usable_bytes,
        headroom=headroom,
    )
    return HostMemory(ranks, method, steady, build, ram_bytes, ram.source, headroom, fixes)


__all__ = [
    "BY_STAGE",
    "CUDA_RUNTIME",
    "CUDA_RUNTIME_BYTES",
    "INDUCTOR_IMPORT",
    "INDUCTOR_IMPORT_BYTES",
    "PARTITIONED",
    "TORCH_RUNTIME_BYTES",
    "TRAINING_RUNTIME_BYTES",
    "WHOLE",
    "ZERO3_DEFRAGMENT",
    "HostMemory",
    "RankBuild",
    "build_bytes",
    "build_method_for",
    "host_memory",
    "largest_stage_params",
]
