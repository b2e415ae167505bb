"""Typed configuration: the schemas every YAML under conf/ names, and the frozen root config.

Hydra composes the YAML files under ``conf/`` onto these dataclasses, so a typo or a
value of the wrong type fails during composition with its key path. The launch layer
(launchers/compose.py) registers them in Hydra's ConfigStore and converts the composed
config once into a frozen :class:`TrainConfig`; nothing in runner/ imports Hydra or
OmegaConf, and nothing below the launch layer sees a ``DictConfig``.

Each key's field carries its meaning in one line and, for a number, its valid range
(runner/key_metadata.py :func:`about`): ``python train.py --help`` prints the one,
runner/preflight/validate.py checks the other before any rank starts. A key with a closed set
of values is typed with its Enum (runner/config_choices.py), re-exported here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from runner.config_choices import (
    DataName,
    HostAllocator,
    LrScaling,
    Objective,
    Offload,
    OffloadPlacement,
    OnNonFinite,
    OptimizerName,
    Precision,
    Recompute,
    Resume,
    RopeScaling,
    Schedule,
    WandbMode,
    ZeroStage,
)
from runner.key_metadata import about

# A field Hydra's composition must fill (OmegaConf's MISSING, spelt as OmegaConf spells it):
# each root field names a config group that conf/config.yaml's defaults list chooses.
MISSING: Any = "???"


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the Llama-style decoder in runner/model/transformer.py."""

    name: str = field(
        default="tiny",
        metadata=about("the conf/model option this shape came from; model=<option> picks one"),
    )
    n_layer: int = field(default=4, metadata=about("transformer blocks", at_least=1))
    n_head: int = field(
        default=4, metadata=about("query heads per block; must divide model.d_model", at_least=1)
    )
    n_kv_head: int | None = field(
        default=None,
        metadata=about(
            "key/value heads, for grouped-query attention; must divide n_head; null: n_head", at_least=1
        ),
    )
    d_model: int = field(default=256, metadata=about("width of the residual stream", at_least=1))
    ffn_hidden: int = field(
        default=688, metadata=about("hidden width of each block's SwiGLU MLP", at_least=1)
    )
    vocab_size: int = field(
        default=256,
        metadata=about("token ids the embedding holds; the built-in text, bytes, needs 256", at_least=2),
    )
    max_seq_len: int = field(
        default=1024,
        metadata=about("longest sequence the rotary tables cover, at least data.seq_len", at_least=1),
    )
    tie_embeddings: bool = field(
        default=True, metadata=about("the output head shares the token embedding's weights")
    )
    norm_eps: float = field(default=1e-5, metadata=about("epsilon of each RMSNorm", above=0))
    rope_theta: float = field(
        default=10000.0, metadata=about("base of the rotary position embedding's frequencies", above=0)
    )
    rope_scaling: RopeScaling = field(
        default=RopeScaling.none,
        metadata=about("RoPE frequency scaling: none, or llama3 (Llama 3.1's, with the rope_* keys below)"),
    )
    rope_scaling_factor: float = field(
        default=8.0,
        metadata=about("llama3 scaling: long wavelengths' frequencies are divided by this", at_least=1),
    )
    rope_low_freq_factor: float = field(
        default=1.0,
        metadata=about(
            "llama3 scaling: wavelengths above rope_original_max_seq_len / this are scaled whole", above=0
        ),
    )
    rope_high_freq_factor: float = field(
        default=4.0,
        metadata=about(
            "llama3 scaling: wavelengths below rope_original_max_seq_len / this are left as they are; "
            "above rope_low_freq_factor",
            above=0,
        ),
    )
    rope_original_max_seq_len: int = field(
        default=8192,
        metadata=about("llama3 scaling: the context length the model was pretrained at", at_least=1),
    )
    qkv_bias: bool = field(
        default=False, metadata=about("the query, key and value projections have biases (Qwen2)")
    )
    hf_config: str | None = field(
        default=None,
        metadata=about(
            "a Hugging Face config.json, or the model directory holding one, that sets the shape (model=hf)"
        ),
    )
    init_from: str | None = field(
        default=None,
        metadata=about(
            "a Hugging Face safetensors directory (or ladder export's) whose weights start training; "
            "null: seeded random weights"
        ),
    )
    init_std: float = field(
        default=0.02,
        metadata=about("standard deviation of the initial weights, as GPT-2's 0.02", above=0),
    )
    activation_checkpointing: Recompute = field(
        default=Recompute.none,
        metadata=about(
            "recompute activations in backward: none; full blocks; selective: keep the matmuls' and "
            "attention's outputs, rerun the rest; attention: rerun the attention core only"
        ),
    )
    loss_tiles: int | None = field(
        default=None,
        metadata=about(
            "pieces along the sequence in which the head and loss run, so the whole (micro, seq, vocab) "
            "logits are never held; null: pieces of at most 1 GiB of fp32 logits; 1: whole",
            at_least=1,
        ),
    )
    mlp_tiles: int = field(
        default=1,
        metadata=about(
            "pieces along the sequence in which each block's MLP runs (DeepSpeed's TiledMLP), so its "
            "(micro, seq, ffn_hidden) tensors exist for one piece at a time; 1: whole",
            at_least=1,
        ),
    )
    offload_activations: bool = field(
        default=False,
        metadata=about(
            "keep each checkpointed block's input in host memory between forward and backward "
            "(DeepSpeed's CheckpointHiddenStatesOffload, as ALST); activation_checkpointing=full only"
        ),
    )


@dataclass(frozen=True)
class OptimizerConfig:
    """Optimizer, warmup and schedule. ``lr`` is the rate at ``reference_batch``."""

    name: OptimizerName = field(
        default=OptimizerName.adamw,
        metadata=about("the optimizer: adamw or sgd; optimizer=<option> sets it"),
    )
    lr: float = field(
        default=3e-3, metadata=about("peak learning rate, at optimizer.reference_batch", above=0)
    )
    weight_decay: float = field(
        default=0.1,
        metadata=about(
            "decoupled weight decay of the matrices and embeddings, not of the norms' gains", at_least=0
        ),
    )
    beta1: float = field(default=0.9, metadata=about("AdamW's first-moment decay", at_least=0, below=1))
    beta2: float = field(default=0.95, metadata=about("AdamW's second-moment decay", at_least=0, below=1))
    eps: float = field(
        default=1e-8, metadata=about("AdamW's epsilon, added to the root of the second moment", at_least=0)
    )
    momentum: float = field(
        default=0.9, metadata=about("SGD's momentum; optimizer=sgd only", at_least=0, below=1)
    )
    warmup_steps: int = field(
        default=10, metadata=about("optimizer steps of linear warmup from 0 to lr", at_least=0)
    )
    schedule: Schedule = field(
        default=Schedule.cosine, metadata=about("the learning rate after warmup: cosine decay or constant")
    )
    min_lr_ratio: float = field(
        default=0.1,
        metadata=about("cosine decays to lr x min_lr_ratio at the last step", at_least=0, at_most=1),
    )
    grad_clip: float = field(
        default=1.0, metadata=about("clip the gradients' global norm to this; 0: no clipping", at_least=0)
    )
    lr_scaling: LrScaling = field(
        default=LrScaling.none,
        metadata=about("how lr follows a global batch other than reference_batch: none, linear or sqrt"),
    )
    reference_batch: int | None = field(
        default=None,
        metadata=about("the global batch lr was tuned at, for lr_scaling; null: the run's own", at_least=1),
    )


@dataclass(frozen=True)
class PrecisionConfig:
    """Compute precision of the run."""

    name: Precision = field(
        default=Precision.fp32,
        metadata=about("compute precision: fp32, bf16 or fp16; precision=<option> sets it"),
    )
    # DeepSpeed's and Megatron-LM's loss_scale_window; the scale halves at every overflow.
    loss_scale_window: int = field(
        default=1000,
        metadata=about("fp16: the loss scale doubles after this many steps without an overflow", at_least=1),
    )


@dataclass(frozen=True)
class ParallelConfig:
    """ZeRO stage, model-parallel degrees and DeepSpeed's communication knobs."""

    name: str = field(
        default="ddp",
        metadata=about("the conf/parallel option these knobs came from; parallel=<option> picks one"),
    )
    zero_stage: int = field(
        default=0,
        metadata=about(
            "ZeRO partitions over dp: 0 nothing, 1 optimizer states, 2 + gradients, 3 + parameters",
            at_least=0,
            at_most=3,
        ),
    )
    tp: int = field(
        default=1,
        metadata=about("tensor-parallel degree: ranks that split each block's matrices", at_least=1),
    )
    pp: int = field(
        default=1, metadata=about("pipeline-parallel degree: stages the blocks are cut into", at_least=1)
    )
    sp: int = field(
        default=1,
        metadata=about(
            "sequence-parallel degree (DeepSpeed-Ulysses): ranks that split each sample's sequence, "
            "trading it for the heads around attention",
            at_least=1,
        ),
    )
    overlap_comm: bool | None = field(
        default=None,
        metadata=about(
            "DeepSpeed overlaps the gradients' reduction with backward; null: DeepSpeed's own "
            "default, on under ZeRO-3 and off below"
        ),
    )
    contiguous_gradients: bool = field(
        default=True, metadata=about("DeepSpeed copies gradients into one buffer as they are made")
    )
    reduce_bucket_size: int = field(
        default=500_000_000,
        metadata=about("elements of gradients DeepSpeed reduces at a time, its default", at_least=1),
    )
    allgather_bucket_size: int = field(
        default=500_000_000,
        metadata=about("elements DeepSpeed all-gathers at a time under ZeRO 1-2, its default", at_least=1),
    )
    # ZeRO-3's parameter fetching; null derives a key from model.d_model as Hugging Face's
    # DeepSpeed integration does (runner.engine.deepspeed_config.zero3_fetch).
    param_persistence_threshold: int | None = field(
        default=None,
        metadata=about(
            "ZeRO-3 keeps parameters of at most this many elements whole on every rank; "
            "null: 10 x model.d_model",
            at_least=0,
        ),
    )
    prefetch_bucket_size: int | None = field(
        default=None,
        metadata=about(
            "elements ZeRO-3 gathers ahead of the module that needs them; 0: none; "
            "null: 0.9 x model.d_model^2",
            at_least=0,
        ),
    )
    max_live_parameters: int = field(
        default=1_000_000_000,
        metadata=about(
            "ZeRO-3 prefetches only while fewer elements than this are gathered; DeepSpeed's default",
            at_least=0,
        ),
    )
    offload_optimizer: Offload = field(
        default=Offload.none,
        metadata=about("ZeRO-Offload: cpu keeps the optimizer states on the host; ZeRO stage 1-3"),
    )
    offload_param: Offload = field(
        default=Offload.none, metadata=about("cpu keeps the 16-bit parameters on the host too; ZeRO stage 3")
    )


@dataclass(frozen=True)
class ParallelSpec:
    """One parallel layout's choices, resolved: what the memory model, the step-time model, the
    planner and the ladder (which varies it) all take. A run's comes from its ``parallel`` group
    and ``model.activation_checkpointing`` (runner.memory_model.case.spec_from_config); the
    data-parallel degree follows from the gpus (runner.layout.Layout).
    """

    zero_stage: ZeroStage
    tp: int = 1
    pp: int = 1
    sp: int = 1  # sequence-parallel ranks per sample (DeepSpeed-Ulysses)
    recompute: Recompute = Recompute.none
    offload: OffloadPlacement = OffloadPlacement.none
    overlap_comm: bool = False  # parallel.overlap_comm, null resolved to the stage's DeepSpeed default
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 500_000_000  # parallel.reduce_bucket_size, as configured
    param_persistence_threshold: int | None = None  # parallel.param_persistence_threshold, as configured

    def __post_init__(self) -> None:
        # The enums' plain values (3, "full", "optimizer+params") are taken too, as tests and
        # notebooks write them; they are held as the members.
        for name, kind in (
            ("zero_stage", ZeroStage),
            ("recompute", Recompute),
            ("offload", OffloadPlacement),
        ):
            object.__setattr__(self, name, kind(getattr(self, name)))


@dataclass(frozen=True)
class DataConfig:
    """Token source and sequence length."""

    name: DataName = field(
        default=DataName.text,
        metadata=about("where tokens come from: text or synthetic; data=<option> sets it"),
    )
    seq_len: int = field(
        default=128, metadata=about("tokens per training sequence, at most model.max_seq_len", at_least=2)
    )
    path: str | None = field(
        default=None, metadata=about("your token file or glob, memory-mapped; null: the built-in text")
    )
    dtype: str = field(
        default="uint16", metadata=about("dtype of data.path's tokens: uint8, uint16 or uint32")
    )
    val_path: str | None = field(
        default=None,
        metadata=about(
            "held-out tokens, in data.path's forms, evaluated every train.eval_every steps; null: the "
            "built-in ones, where train.eval_every is set"
        ),
    )
    max_bytes: int = field(
        default=16_000_000, metadata=about("cap on the built-in text corpus, in bytes", at_least=1)
    )
    tokenizer: str | None = field(
        default=None,
        metadata=about("the Hugging Face tokenizer directory data.path was tokenized with; null: none"),
    )
    skip_steps: int = field(
        default=0,
        metadata=about(
            "step t trains on the batch of step t + skip_steps: a run from an export continues its "
            "run's data (ladder_export.json completed_steps)",
            at_least=0,
        ),
    )


@dataclass(frozen=True)
class ClusterConfig:
    """The hardware the run is sized for. ``None`` means: detect on this host."""

    name: str = field(
        default="local",
        metadata=about("the conf/cluster option; cluster=<option> picks one; local: this host"),
    )
    gpus_per_node: int | None = field(
        default=None, metadata=about("devices per node; null: this host's", at_least=1)
    )
    device_memory_gb: float | None = field(
        default=None, metadata=about("memory per device, GB = 1e9 bytes; null: detect", above=0)
    )
    host_memory_gb: float | None = field(
        default=None,
        metadata=about("host RAM per node, shared by its ranks, GB = 1e9 bytes; null: detect", above=0),
    )
    peak_tflops_bf16: float | None = field(
        default=None, metadata=about("dense bf16 peak per device, TFLOP/s; null: detect", above=0)
    )
    peak_tflops_fp32: float | None = field(
        default=None, metadata=about("dense fp32 peak per device, TFLOP/s; null: detect", above=0)
    )
    peak_tflops: float | None = field(
        default=None, metadata=about("overrides the peak for the run's precision, TFLOP/s", above=0)
    )
    hbm_gbps: float | None = field(
        default=None,
        metadata=about(
            "device memory bandwidth, GB/s: scales a borrowed calibration's memory-bound figures",
            above=0,
        ),
    )
    intra_node_gbps: float | None = field(
        default=None, metadata=about("GB/s per device inside a node, one direction", above=0)
    )
    inter_node_gbps: float | None = field(
        default=None, metadata=about("GB/s of one network port between nodes, one direction", above=0)
    )
    nics_per_node: int | None = field(
        default=None,
        metadata=about(
            "network ports per node, each a rail NCCL runs its rings over; null: one per device",
            at_least=1,
        ),
    )
    collective_base_us: float | None = field(
        default=None,
        metadata=about(
            "NCCL's latency once per collective, microseconds; null: collectives priced by bandwidth alone",
            at_least=0,
        ),
    )
    intra_node_step_us: float | None = field(
        default=None,
        metadata=about("NCCL's latency of one ring step inside a node, microseconds", at_least=0),
    )
    inter_node_step_us: float | None = field(
        default=None,
        metadata=about("NCCL's latency of one ring step between nodes, microseconds", at_least=0),
    )
    storage_gb_per_s: float | None = field(
        default=None,
        metadata=about(
            "the checkpoint filesystem's write speed, every rank's writes together, GB/s; null: unknown",
            above=0,
        ),
    )
    storage_path: str | None = field(
        default=None,
        metadata=about(
            "a directory on the cluster's checkpoint filesystem, for a plan made elsewhere to weigh"
        ),
    )
    calibration: str | None = field(
        default=None,
        metadata=about(
            "the named cluster whose step-time calibration (conf/cluster/calibration/<name>.json) this "
            "one borrows, compute scaled by the bf16 peaks' ratio; null: its own file, or none. On "
            "cluster=local: a file of this host's figures (a path, or such a name) to plan from instead "
            "of measuring here ($LADDER_CALIBRATION by default)"
        ),
    )
    source: str = field(default="", metadata=about("where the figures come from: datasheets, or this host"))


@dataclass(frozen=True)
class LoggerConfig:
    """Metric sinks: JSONL files always, wandb unless disabled."""

    name: str = field(
        default="wandb", metadata=about("the conf/logger option: wandb or none; logger=<option> picks one")
    )
    mode: WandbMode = field(
        default=WandbMode.offline,
        metadata=about("wandb's mode: offline needs no account, online streams, disabled"),
    )
    project: str = field(default="ladder", metadata=about("wandb project"))
    entity: str | None = field(
        default=None, metadata=about("wandb entity, a user or team; null: the account's default")
    )
    base_url: str | None = field(
        default=None, metadata=about("a self-hosted wandb server; null: wandb's own")
    )
    log_every: int = field(default=1, metadata=about("optimizer steps between logged metrics", at_least=1))
    progress: bool = field(
        default=True, metadata=about("print a progress line per logged step and the run's tables at its end")
    )


@dataclass(frozen=True)
class BatchConfig:
    """The batch contract: ``global_size`` is the experiment; ``micro_size`` is an int or ``auto``."""

    global_size: int = field(
        default=16,
        metadata=about("sequences per optimizer step: the experiment, held fixed across layouts", at_least=1),
    )
    micro_size: str = field(
        default="auto", metadata=about("sequences per rank per forward, or auto: the largest that fits")
    )
    allow_varying: bool = field(
        default=False, metadata=about("let a sweep's cells train different global_size")
    )


@dataclass(frozen=True)
class TrainLoopConfig:
    """Length of the run, checkpoints, resume and what a non-finite loss does."""

    steps: int = field(default=60, metadata=about("optimizer steps the run trains", at_least=1))
    checkpoint_every: int = field(
        default=0, metadata=about("optimizer steps between checkpoints; 0: one only at a stop", at_least=0)
    )
    keep_checkpoints: int = field(
        default=2, metadata=about("complete checkpoints kept, newest first", at_least=1)
    )
    save_final: bool = field(
        default=True,
        metadata=about(
            "save a checkpoint after the last step, which ladder export and a longer run continue "
            "from; false: only those of checkpoint_every and a stop"
        ),
    )
    resume: Resume = field(
        default=Resume.never,
        metadata=about(
            "never; auto: continue from the run directory's latest complete checkpoint, else start "
            "at step 0; required: as auto, but refuse the run when there is none"
        ),
    )
    on_nonfinite: OnNonFinite = field(
        default=OnNonFinite.stop,
        metadata=about("what a NaN or inf loss does: stop the run, or skip the step's update and go on"),
    )
    max_skipped_steps: int = field(
        default=10,
        metadata=about(
            "with on_nonfinite=skip: stop at the next non-finite loss after this many skips", at_least=0
        ),
    )
    compile: bool = field(
        default=False,
        metadata=about("torch.compile each transformer block: faster steps after a slower first one"),
    )
    host_allocator: HostAllocator = field(
        default=HostAllocator.auto,
        metadata=about(
            "a CPU rank's malloc: jemalloc keeps freed memory for reuse (no page faults each step); "
            "auto: jemalloc where libjemalloc.so.2 is installed, else system (glibc)"
        ),
    )
    profile_step: int = field(
        default=-1,
        metadata=about("trace this step with torch.profiler, below train.steps; -1: none", at_least=-1),
    )
    eval_every: int = field(
        default=0,
        metadata=about(
            "optimizer steps between held-out evaluations, and one after the last; 0: none, or, where "
            "data.val_path is given, every train.steps / 5",
            at_least=0,
        ),
    )
    eval_batches: int = field(
        default=4,
        metadata=about(
            "global batches of held-out sequences per evaluation, the same ones each time", at_least=1
        ),
    )


@dataclass(frozen=True)
class PlannerConfig:
    """Planning: ``plan=true`` stops before launch; these tune what it considers."""

    recommend: bool = field(
        default=False,
        metadata=about(
            "plan every layout of the ladder of remedies, rank those that fit by predicted tokens/s and "
            "name the best; implies plan=true"
        ),
    )
    objective: Objective = field(
        default=Objective.speed,
        metadata=about(
            "batch.micro_size=auto takes, of the sizes that fit, the predicted fastest (speed; within 5%: "
            "the largest) or the largest (memory)"
        ),
    )
    max_seq: bool = field(
        default=False,
        metadata=about(
            "also find the longest data.seq_len the planned layout fits, in each recompute mode; "
            "implies plan=true"
        ),
    )
    headroom: float = field(
        default=0.9,
        metadata=about(
            "a layout fits when it plans at most this fraction of device and host memory",
            above=0,
            at_most=1,
        ),
    )


@dataclass(frozen=True)
class TrainConfig:
    """The root config: one experiment, one layout."""

    model: ModelConfig = field(default=MISSING, metadata=about("the decoder's shape (conf/model/)"))
    optimizer: OptimizerConfig = field(
        default=MISSING, metadata=about("optimizer, warmup and schedule (conf/optimizer/)")
    )
    precision: PrecisionConfig = field(default=MISSING, metadata=about("compute precision (conf/precision/)"))
    parallel: ParallelConfig = field(
        default=MISSING, metadata=about("ZeRO stage, tp, pp and DeepSpeed's knobs (conf/parallel/)")
    )
    data: DataConfig = field(default=MISSING, metadata=about("token source and sequence length (conf/data/)"))
    cluster: ClusterConfig = field(
        default=MISSING, metadata=about("the hardware the run is sized for (conf/cluster/)")
    )
    logger: LoggerConfig = field(default=MISSING, metadata=about("metric sinks (conf/logger/)"))
    batch: BatchConfig = field(
        default_factory=BatchConfig, metadata=about("the batch contract: global = micro x accum x dp")
    )
    train: TrainLoopConfig = field(
        default_factory=TrainLoopConfig, metadata=about("length, checkpoints, resume, evaluation")
    )
    planner: PlannerConfig = field(default_factory=PlannerConfig, metadata=about("what plan=true considers"))
    gpus: int = field(default=1, metadata=about("ranks; dp = gpus / (tp x pp x sp)", at_least=1))
    seed: int = field(
        default=0,
        metadata=about("seeds the weights and the batches, a function of seed and step alone", at_least=0),
    )
    plan: bool = field(
        default=False, metadata=about("true: print the memory and time plan, write plan.json, launch nothing")
    )

    @property
    def planning(self) -> bool:
        """plan=true, or a planner question that implies it (planner.recommend, planner.max_seq)."""
        return self.plan or self.planner.recommend or self.planner.max_seq


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


# The schemas, and the closed sets of values their keys take (runner/config_choices.py), which
# the code imports from here alongside them.
__all__ = [
    "MISSING",
    "BatchConfig",
    "ClusterConfig",
    "DataConfig",
    "DataName",
    "HostAllocator",
    "LoggerConfig",
    "LrScaling",
    "ModelConfig",
    "Objective",
    "Offload",
    "OffloadPlacement",
    "OnNonFinite",
    "OptimizerConfig",
    "OptimizerName",
    "ParallelConfig",
    "ParallelSpec",
    "PlannerConfig",
    "Precision",
    "PrecisionConfig",
    "Recompute",
    "Resume",
    "RopeScaling",
    "Schedule",
    "TrainConfig",
    "TrainLoopConfig",
    "WandbMode",
    "ZeroStage",
    "to_dict",
]
