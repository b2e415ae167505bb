"""What a plan is made of: the workload that stays fixed whatever the layout, and the knobs a layout sets.

runner/plan/planner.py plans a (Workload, Knobs) pair at the batch contract's layout
(runner.layout.Layout); the step time (runner/step_time/estimate.py) and a node's host memory
(runner/plan/host.py) read the same three. The ladder (runner/plan/ladder.py) varies the knobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import ModelConfig, OffloadPlacement, OptimizerName, Precision, Recompute, ZeroStage
from runner.step_time.device_figures import Device


@dataclass(frozen=True)
class Workload:
    """What stays fixed whatever the layout: the experiment, the gpus and the device."""

    model: ModelConfig
    num_params: int
    precision: Precision
    optimizer: OptimizerName
    seq_len: int
    global_size: int
    gpus: int
    headroom: float
    device: Device
    cluster: str
    compiled: bool = False  # train.compile: the blocks' activations as a compiled graph saves them
    # train.host_allocator resolved to jemalloc: a CPU rank's large tensors reuse warm pages, no faults
    keeps_freed_memory: bool = False
    eval_every: int = 0  # train.eval_every: steps between held-out evaluations (0: none)
    eval_batches: int = 0  # train.eval_batches: global batches an evaluation reads
    checkpoint_every: int = 0  # train.checkpoint_every: steps between saves (0: only at a stop)
    storage_bytes_per_s: float | None = None  # cluster.storage_gb_per_s (None: unknown)

    @property
    def usable_bytes(self) -> float:
        """Device bytes a layout may use: headroom x device memory."""
        return self.headroom * float(self.device.memory_bytes.value or 0.0)


@dataclass(frozen=True)
class Knobs:
    """The layout choices: what the ladder varies and a run's ``parallel``/``batch`` config sets."""

    parallel: str  # the conf/parallel option: ddp, zero1, zero2, zero3 (ZeroStage's names)
    zero_stage: ZeroStage
    tp: int = 1
    pp: int = 1
    recompute: Recompute = Recompute.none
    offload: OffloadPlacement = OffloadPlacement.none
    micro_size: int | None = None  # None: auto
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    # Elements of DeepSpeed's gradient bucket (runner.engine.deepspeed_config.reduce_bucket_elements);
    # ZeRO-3 allocates it up front.
    reduce_bucket_size: int = 500_000_000
    # parallel.param_persistence_threshold: ZeRO-3 keeps tensors of at most this many elements
    # whole on every rank; None: from the model (runner.engine.deepspeed_config.zero3_fetch).
    param_persistence_threshold: int | None = None

    def describe(self) -> str:
        """Short words for the layout: 'zero3 + full recompute + offload optimizer, tp 2'."""
        words = [self.parallel]
        if self.recompute != Recompute.none:
            words.append(f"{self.recompute.value} recompute")
        if self.offload != OffloadPlacement.none:
            words.append(f"offload {self.offload.value}")
        text = " + ".join(words)
        if self.tp > 1:
            text += f", tp {self.tp}"
        if self.pp > 1:
            text += f", pp {self.pp}"
        return text


__all__ = ["Knobs", "Workload"]
