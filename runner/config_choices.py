"""The closed sets of values the config's keys take: each an Enum whose values are the spellings
conf/ and the command line use.

runner/config.py types its keys with these (and re-exports them), so composition refuses any
other value with its key path. Two are read off keys rather than typing one: :class:`ZeroStage`
(parallel.zero_stage, named by conf/parallel's options) and :class:`OffloadPlacement` (the two
parallel.offload_* keys together).
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import Any


class Precision(str, Enum):
    """Training precision: fp32 everywhere, or 16-bit compute with fp32 master weights."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"

    @property
    def bytes(self) -> int:
        """Bytes of one element computed in this precision: 4 in fp32, 2 in bf16 and fp16."""
        return 4 if self is Precision.fp32 else 2

    @property
    def torch_dtype_name(self) -> str:
        """torch's name of this precision's compute dtype (float32, bfloat16, float16), known without
        torch: how a calibration file names the dtype it timed in."""
        return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[self.value]

    @property
    def torch_dtype(self) -> Any:
        """The torch dtype of this precision's compute."""
        import torch  # deferred: the config, the plan and the launcher are read without torch

        return getattr(torch, self.torch_dtype_name)


class OptimizerName(str, Enum):
    """Optimizers the runner builds."""

    adamw = "adamw"
    sgd = "sgd"


class Schedule(str, Enum):
    """Learning-rate shape after warmup."""

    cosine = "cosine"
    constant = "constant"


class LrScaling(str, Enum):
    """How the learning rate follows a global batch that differs from the reference batch."""

    none = "none"
    linear = "linear"
    sqrt = "sqrt"


class Recompute(str, Enum):
    """Activation checkpointing: none, whole blocks, op-level selective, or only the attention core."""

    none = "none"
    full = "full"
    selective = "selective"  # keep the matmuls' and attention's outputs (runner/model/op_recompute.py)
    attention = "attention"  # rerun the attention core only (Korthikanti et al. 2022's selective)


class RopeScaling(str, Enum):
    """How RoPE's frequencies are rescaled for contexts longer than pretraining's."""

    none = "none"
    llama3 = "llama3"  # Llama 3.1's: long wavelengths slowed by a factor, a smooth band between


class DataName(str, Enum):
    """Where tokens come from."""

    text = "text"
    synthetic = "synthetic"


class Offload(str, Enum):
    """Where ZeRO keeps an offloaded tensor."""

    none = "none"
    cpu = "cpu"


class WandbMode(str, Enum):
    """wandb's modes: offline needs no account and no network."""

    offline = "offline"
    online = "online"
    disabled = "disabled"


class Objective(str, Enum):
    """What ``batch.micro_size=auto`` optimises among the micro-batch sizes that fit."""

    speed = "speed"  # the one the step-time model predicts fastest (ties: the largest)
    memory = "memory"  # the largest that fits


class OffloadPlacement(str, Enum):
    """What ZeRO-Offload keeps in host memory, from parallel.offload_optimizer and parallel.offload_param.

    ``optimizer``: the optimizer states and the fp32 gradient partition the CPU optimizer steps
    (ZeRO stages 1-3; Ren et al. 2021, arXiv 2101.06840); ``optimizer+params``: the 16-bit
    parameter partition too (ZeRO stage 3 only).
    """

    none = "none"
    optimizer = "optimizer"
    optimizer_and_params = "optimizer+params"


class ZeroStage(IntEnum):
    """ZeRO stage (Rajbhandari et al. 2019, arXiv 1910.02054): what is partitioned over dp.

    Each name is the conf/parallel option that sets this stage and nothing else.
    """

    ddp = 0  # nothing partitioned: plain data parallel
    zero1 = 1  # optimizer states
    zero2 = 2  # + gradients
    zero3 = 3  # + parameters

    # What each stage partitions over dp, as DeepSpeed 0.19.8 decides it from the stage's number
    # (deepspeed/runtime/zero/config.py ``ZeroStageEnum``: optimizer_states 1, gradients 2,
    # weights 3); each stage partitions what the one below it does, and one thing more.

    @property
    def shards_optimizer_states(self) -> bool:
        """Whether each dp rank keeps only its partition of the optimizer states (and steps only it):
        stages 1-3, the stages at which DeepSpeed wraps the optimizer in ZeRO's
        (deepspeed/runtime/config.py ``zero_enabled``: stage > 0)."""
        return self >= ZeroStage.zero1

    @property
    def shards_gradients(self) -> bool:
        """Whether each dp rank keeps only its partition of the gradients: stages 2-3
        (deepspeed/runtime/engine.py ``zero_optimization_partition_gradients``: stage >= 2)."""
        return self >= ZeroStage.zero2

    @property
    def shards_parameters(self) -> bool:
        """Whether each dp rank keeps only its partition of the parameters, gathering them to
        compute: stage 3 (deepspeed/runtime/engine.py ``zero_optimization_partition_weights``:
        stage >= 3)."""
        return self >= ZeroStage.zero3

    def overlaps_comm(self, overlap_comm: bool | None) -> bool:
        """Whether DeepSpeed overlaps the gradients' reduction with backward at this stage:
        ``parallel.overlap_comm``, or where it is null DeepSpeed's own default, on at ZeRO-3
        and off below (deepspeed/runtime/zero/config.py ``overlap_comm_valid``)."""
        return overlap_comm if overlap_comm is not None else self is ZeroStage.zero3


class Resume(str, Enum):
    """Where a run starts: from scratch, or from the latest complete checkpoint of its directory."""

    never = "never"
    auto = "auto"
    required = "required"  # as auto, but refused before launch when there is no checkpoint


class OnNonFinite(str, Enum):
    """What a non-finite loss does: stop the run, or skip the step's update and go on."""

    stop = "stop"
    skip = "skip"


class HostAllocator(str, Enum):
    """The C allocator a CPU rank runs with (runner/hardware/host_allocator.py)."""

    auto = "auto"  # jemalloc where it is installed, else the system's
    jemalloc = "jemalloc"  # refused before launch where it is not installed
    system = "system"  # the C library's malloc (glibc)
