"""What a plan is made of: the workload that stays fixed whatever the layout, and the knobs a layout sets.

runner/plan/planner.py plans a (Workload, Knobs) pair at the batch contract's layout
(runner.layout.Layout); the step time (runner/step_time/estimate.py) and a node's host memory
(runner/plan/host.py) read the same three. The ladder (runner/plan/ladder.py) varies the knobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import ModelConfig, OffloadPlacement, OptimizerName, ParallelSpec, Precision, Recompute
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
    spec: ParallelSpec
    micro_size: int | None = None  # None: auto

    def describe(self) -> str:
        """Short words for the layout: 'zero3 + full recompute + offload optimizer, tp 2'."""
        spec = self.spec
        words = [self.parallel]
        if spec.recompute != Recompute.none:
            words.append(f"{spec.recompute.value} recompute")
        if spec.offload != OffloadPlacement.none:
            words.append(f"offload {spec.offload.value}")
        text = " + ".join(words)
        if spec.tp > 1:
            text += f", tp {spec.tp}"
        if spec.pp > 1:
            text += f", pp {spec.pp}"
        if spec.sp > 1:
            text += f", sp {spec.sp}"
        return text


__all__ = ["Knobs", "Workload"]
