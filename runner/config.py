"""Typed configuration: the schemas every YAML under conf/ names, and the frozen root config.

Hydra composes the YAML files under ``conf/`` onto these dataclasses, so a typo or a
value of the wrong type fails during composition with its key path. The launch layer
(launchers/compose.py) registers them in Hydra's ConfigStore and converts the composed
config once into a frozen :class:`TrainConfig`; nothing in runner/ imports Hydra or
OmegaConf, and nothing below the launch layer sees a ``DictConfig``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

# A field Hydra's composition must fill (OmegaConf's MISSING, spelt as OmegaConf spells it):
# each root field names a config group that conf/config.yaml's defaults list chooses.
MISSING: Any = "???"


class Precision(str, Enum):
    """Training precision: fp32 everywhere, or 16-bit compute with fp32 master weights."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


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
    """Activation checkpointing: none, whole blocks, or only the attention core."""

    none = "none"
    full = "full"
    selective = "selective"


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


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the Llama-style decoder in runner/model/transformer.py."""

    name: str = "tiny"
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None  # None: as many key/value heads as query heads
    d_model: int = 256
    ffn_hidden: int = 688  # SwiGLU hidden width
    vocab_size: int = 256
    max_seq_len: int = 1024
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    init_std: float = 0.02
    activation_checkpointing: Recompute = Recompute.none


@dataclass(frozen=True)
class OptimizerConfig:
    """Optimizer, warmup and schedule. ``lr`` is the rate at ``reference_batch``."""

    name: OptimizerName = OptimizerName.adamw
    lr: float = 3e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9  # sgd only
    warmup_steps: int = 10
    schedule: Schedule = Schedule.cosine
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at the last step
    grad_clip: float = 1.0  # 0 disables clipping
    lr_scaling: LrScaling = LrScaling.none
    reference_batch: int | None = None  # None: the run's own global batch


@dataclass(frozen=True)
class PrecisionConfig:
    """Compute precision of the run."""

    name: Precision = Precision.fp32
    # fp16's dynamic loss scale doubles after this many steps without an overflow (DeepSpeed's
    # and Megatron-LM's loss_scale_window); it halves at every overflow.
    loss_scale_window: int = 1000


@dataclass(frozen=True)
class ParallelConfig:
    """ZeRO stage, model-parallel degrees and DeepSpeed's communication knobs."""

    name: str = "ddp"
    zero_stage: int = 0
    tp: int = 1
    pp: int = 1
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 500_000_000  # elements, DeepSpeed's default
    allgather_bucket_size: int = 500_000_000  # elements, DeepSpeed's default
    param_persistence_threshold: int = 100_000  # ZeRO-3 keeps smaller params whole (elements)
    offload_optimizer: Offload = Offload.none
    offload_param: Offload = Offload.none


@dataclass(frozen=True)
class DataConfig:
    """Token source and sequence length."""

    name: DataName = DataName.text
    seq_len: int = 128
    path: str | None = None  # a user's token file, memory-mapped; None = built-in text
    dtype: str = "uint16"  # dtype of that file: uint8, uint16 or uint32
    val_path: str | None = None  # held-out tokens for train.eval_every (same forms as path); None = built-in
    max_bytes: int = 16_000_000  # cap on the built-in text corpus


@dataclass(frozen=True)
class ClusterConfig:
    """The hardware the run is sized for. ``None`` means: detect on this host."""

    name: str = "local"
    gpus_per_node: int | None = None
    device_memory_gb: float | None = None  # GB = 1e9 bytes
    host_memory_gb: float | None = None  # host RAM per node, shared by its ranks; GB = 1e9 bytes
    peak_tflops_bf16: float | None = None  # dense, per device
    peak_tflops_fp32: float | None = None  # dense, per device
    peak_tflops: float | None = None  # overrides the peak for the run's precision
    intra_node_gbps: float | None = None  # GB/s per device, one direction
    inter_node_gbps: float | None = None  # GB/s per device, one direction
    # The checkpoint filesystem's write speed, every rank's writes together; None: unknown.
    storage_gb_per_s: float | None = None
    source: str = ""


@dataclass(frozen=True)
class LoggerConfig:
    """Metric sinks: JSONL files always, wandb unless disabled."""

    name: str = "wandb"
    mode: WandbMode = WandbMode.offline
    project: str = "ladder"
    entity: str | None = None
    base_url: str | None = None  # a self-hosted wandb server
    log_every: int = 1
    progress: bool = True


@dataclass(frozen=True)
class BatchConfig:
    """The batch contract: ``global_size`` is the experiment; ``micro_size`` is an int or ``auto``."""

    global_size: int = 16
    micro_size: str = "auto"
    allow_varying: bool = False


class Resume(str, Enum):
    """Where a run starts: from scratch, or from the latest complete checkpoint of its directory."""

    never = "never"
    auto = "auto"


class OnNonFinite(str, Enum):
    """What a non-finite loss does: stop the run, or skip the step's update and go on."""

    stop = "stop"
    skip = "skip"


@dataclass(frozen=True)
class TrainLoopConfig:
    """Length of the run, checkpoints, resume and what a non-finite loss does."""

    steps: int = 60
    checkpoint_every: int = 0  # optimizer steps between checkpoints; 0: none
    keep_checkpoints: int = 2  # complete checkpoints kept, newest first
    resume: Resume = Resume.never
    on_nonfinite: OnNonFinite = OnNonFinite.stop  # runner/train/nonfinite.py
    max_skipped_steps: int = 10  # with skip: the run stops at the next non-finite loss after this many
    compile: bool = False  # torch.compile each transformer block (runner/engine/compile_blocks.py)
    profile_step: int = -1  # trace this step with torch.profiler (runner/metrics/step_profiler.py); -1: none
    eval_every: int = 0  # optimizer steps between held-out evaluations, and one after the last; 0: none
    eval_batches: int = 4  # global batches of held-out sequences per evaluation, the same ones each time


@dataclass(frozen=True)
class PlannerConfig:
    """Planning: ``plan=true`` stops before launch; these tune what it considers."""

    recommend: bool = False
    headroom: float = 0.9  # a layout fits when it uses at most this fraction of device memory


@dataclass(frozen=True)
class TrainConfig:
    """The root config: one experiment, one layout."""

    model: ModelConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    precision: PrecisionConfig = MISSING
    parallel: ParallelConfig = MISSING
    data: DataConfig = MISSING
    cluster: ClusterConfig = MISSING
    logger: LoggerConfig = MISSING
    batch: BatchConfig = field(default_factory=BatchConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    gpus: int = 1
    seed: int = 0
    plan: bool = False


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (enums as their values)."""

    def convert(value: Any) -> Any:
        if isinstance(value, Enum):
            return value.value
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        return value

    return convert(dataclasses.asdict(config))
