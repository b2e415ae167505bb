"""The plan against published training runs: tokens/s and memory per GPU, and whether each fits.

Each row is a run a peer published with its layout and its measured speed (or its out-of-memory),
planned here with ``plan=true``'s planner (runner/plan/planner.py ``plan_config``, in this
process; the datasheet clusters measure nothing on this host). Printed: the predicted tokens/s
per GPU beside the published one and the error (p - m) / m, the planned peak memory per GPU
(GiB = 2^30 B) beside the published one where the source gives it, and the plan's fit beside the
published outcome. The loss runs whole (``model.loss_tiles=1``), as in every run listed.

    python bench/published_runs.py

The cases come in two halves: ``tuning``, which may be looked at while changing the step-time
model, and ``held-out``, only reported. Every case names its source in :data:`SOURCES` and says
in ``differs`` what ladder's plan of it leaves out. Only layouts ladder can express: dense
decoders, tp/pp/dp with ZeRO and recompute; no MoE, no context or sequence parallelism, no fp8.

The last lines are ``<half>: median_abs_err=<x> max_abs_err=<y> fits_agree=<a>/<n>``, one a half.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30

# Where each case's numbers are read: repository, path and commit, and the table.
SOURCES = {
    "torchtitan-a100": (
        "pytorch/torchtitan docs/performance.md @ 041336434916: 64 A100 80GB, FSDP2, bf16, "
        "Llama 3 at seq 8192 and Llama 2 at 4096 (footnote 1: the out-of-memory case)"
    ),
    "torchtitan-h100": (
        "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md @ 31a17bfdb70b: "
        "Tables 1 and 3 (FSDP, Llama 3.1 8B, 8 and 128 H100 96GB HBM2e at 500 W, no compile)"
    ),
    "llm-foundry-h100": (
        "mosaicml/llm-foundry scripts/train/benchmarking/README.md @ 061f2c7ce64e: "
        "'H100 80GB BF16' table (MPT, FSDP FULL_SHARD, amp_bf16)"
    ),
    "llm-foundry-a100": (
        "mosaicml/llm-foundry scripts/train/benchmarking/README.md @ 061f2c7ce64e: "
        "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)' table (MPT, FSDP FULL_SHARD)"
    ),
    "maxtext-h100": (
        "NVIDIA/dgxc-benchmarking maxtext/README_70b.md @ 85380ffe02ea (v25.04.01): 'Maxtext Llama3 70b "
        "BF16' table (JAX MaxText 25.01 on DGX H100 80GB, FSDP over every GPU up to 256 and over 128 "
        "from 512), its layouts in the file's first table and maxtext/configure.sh (remat save_qkv_proj)"
    ),
}

# ZeRO-3 is FSDP's FULL_SHARD; every run below is bf16 and plans its loss whole.
COMMON = ["parallel=zero3", "precision=bf16", "model.loss_tiles=1"]
A100_64 = ["cluster=a100_80g", "gpus=64", *COMMON]
LLAMA3_70B = ["model=llama_70b", "model.vocab_size=128256", "model.rope_theta=500000"]
# torchtitan's Grand Teton H100s: 96 GB of HBM2e at 2.4 TB/s (its benchmark's "Hardware").
GRAND_TETON = ["cluster=h100_sxm", "cluster.device_memory_gb=103.08", "cluster.hbm_gbps=2400", *COMMON]
FSDP2 = "FSDP2 (ZeRO-3's sharding) where ladder plans DeepSpeed's ZeRO-3"
MAXTEXT_DIFFERS = (
    "JAX/XLA MaxText (cuDNN attention, XLA-fused collectives) where ladder plans PyTorch and "
    "DeepSpeed's ZeRO-3; remat policy save_qkv_proj (recomputes all but the q/k/v projections) "
    "planned as full recompute; synthetic data"
)
MPT_DIFFERS = (
    "MPT (ALiBi, GELU MLP of 4h planned as SwiGLU of 8h/3: same parameters and FLOPs; heads at "
    "head dim 128); Composer's FSDP with fp32 sharded parameters where ladder plans DeepSpeed's "
    "bf16 ZeRO-3; Triton/flash attention"
)


def mpt(d_model: int, n_layer: int, seq_len: int) -> list[str]:
    """An MPT model (llm-foundry's yamls: vocabulary 50,368, tied embeddings) as ladder's keys."""
    return [
        "model=llama_7b",
        f"model.d_model={d_model}",
        f"model.n_layer={n_layer}",
        f"model.n_head={d_model // 128}",
        f"model.ffn_hidden={round(8 * d_model / 3)}",
        "model.vocab_size=50368",
        "model.tie_embeddings=true",
        f"model.max_seq_len={seq_len}",
        f"data.seq_len={seq_len}",
    ]


def batch(gpus: int, micro: int, accum: int) -> list[str]:
    """gpus, micro-batch and the global batch they make with ``accum`` accumulation steps."""
    return [f"gpus={gpus}", f"batch.micro_size={micro}", f"batch.global_size={gpus * micro * accum}"]


@dataclass(frozen=True)
class Published:
    """One published run: its overrides here, its tokens/s per GPU (None: it ran out of memory)."""

    label: str
    overrides: list[str]
    tokens_per_gpu: float | None
    source: str  # a key of SOURCES
    half: Literal["tuning", "held-out"]
    memory_gib: float | None = None  # the source's peak memory per GPU, GiB (None: not given)
    differs: list[str] = field(default_factory=list)


RUNS = [
    Published(
        "torchtitan Llama 3 8B, A100 x64, micro 1, seq 8192, selective op",
        [
            *A100_64,
            "model=llama3_8b",
            *batch(64, 1, 1),
            "data.seq_len=8192",
            "model.activation_checkpointing=selective",
        ],
        2973,
        "torchtitan-a100",
        "tuning",
        differs=[FSDP2],
    ),
    Published(
        "torchtitan Llama 3 70B, A100 x64, micro 1, seq 8192, full",
        [
            *A100_64,
            *LLAMA3_70B,
            *batch(64, 1, 1),
            "data.seq_len=8192",
            "model.max_seq_len=8192",
            "model.activation_checkpointing=full",
        ],
        331,
        "torchtitan-a100",
        "tuning",
        differs=[FSDP2, "Llama 3 70B as Llama 2 70B's shape with Llama 3's vocabulary"],
    ),
    Published(
        "torchtitan Llama 2 70B, A100 x64, micro 1, seq 4096, selective op",
        [
            *A100_64,
            "model=llama_70b",
            *batch(64, 1, 1),
            "data.seq_len=4096",
            "model.activation_checkpointing=selective",
        ],
        355,
        "torchtitan-a100",
        "tuning",
        differs=[FSDP2],
    ),
    Published(
        "torchtitan Llama 2 70B, A100 x64, micro 2, seq 4096, full",
        [
            *A100_64,
            "model=llama_70b",
            *batch(64, 2, 1),
            "data.seq_len=4096",
            "model.activation_checkpointing=full",
        ],
        353,
        "torchtitan-a100",
        "tuning",
        differs=[FSDP2],
    ),
    Published(
        "torchtitan Llama 2 70B, A100 x64, micro 2, seq 4096, selective op: OOM",
        [
            *A100_64,
            "model=llama_70b",
            *batch(64, 2, 1),
            "data.seq_len=4096",
            "model.activation_checkpointing=selective",
        ],
        None,
        "torchtitan-a100",
        "tuning",
        differs=[FSDP2],
    ),
    *(
        Published(
            f"llm-foundry MPT-{name}, H100 x{gpus}, micro {micro}, accum {accum}, seq 2048, {ac}",
            [
                "cluster=h100_sxm",
                *COMMON,
                *mpt(d_model, n_layer, 2048),
                *batch(gpus, micro, accum),
                f"model.activation_checkpointing={ac}",
            ],
            speed,
            "llm-foundry-h100",
            "tuning",
            differs=[MPT_DIFFERS],
        )
        for name, d_model, n_layer, gpus, micro, accum, ac, speed in [
            ("1b", 2048, 24, 64, 20, 1, "none", 44402),
            ("7b", 4096, 32, 8, 6, 1, "none", 10643),
            ("13b", 5120, 40, 8, 2, 1, "none", 4792),
            ("30b", 7168, 48, 8, 3, 21, "full", 2002),
            ("70b", 8192, 80, 64, 8, 4, "full", 1039),
        ]
    ),
    *(
        Published(
            f"torchtitan Llama 3.1 8B, H100 96GB x{gpus}, micro 2, seq 8192, selective op",
            [
                *GRAND_TETON,
                "model=llama3_1_8b",
                *batch(gpus, 2, 1),
                "data.seq_len=8192",
                "model.activation_checkpointing=selective",
            ],
            speed,
            "torchtitan-h100",
            "held-out",
            memory_gib=memory,
            differs=[FSDP2, "500 W power limit where the datasheet's peak is at 700 W"],
        )
        for gpus, speed, memory in [(8, 5762, 82.4), (128, 5605, 67.0)]
    ),
    *(
        Published(
            f"llm-foundry MPT-{name}, A100 x{gpus}, micro {micro}, accum {accum}, seq 2048, {ac}",
            [
                "cluster=a100_80g",
                *COMMON,
                *mpt(d_model, n_layer, 2048),
                *batch(gpus, micro, accum),
                f"model.activation_checkpointing={ac}",
            ],
            speed,
            "llm-foundry-a100",
            "held-out",
            differs=[MPT_DIFFERS, "RoCE between nodes"],
        )
        for name, d_model, n_layer, gpus, micro, accum, ac, speed in [
            ("3b", 2560, 32, 8, 10, 2, "none", 10811),
            ("7b", 4096, 32, 8, 6, 2, "none", 4641),
            ("13b", 5120, 40, 8, 2, 3, "none", 2262),
            ("30b", 7168, 48, 8, 3, 21, "full", 916),
            ("70b", 8192, 80, 64, 8, 4, "full", 410),
        ]
    ),
    # Tokens/s per GPU = seq 8192 x per-device batch 2 / the table's step time (its GBS is gpus x 2).
    # From 512 GPUs, configure.sh shards over 16 nodes (dcn_FSDP=16) and replicates across the rest.
    *(
        Published(
            f"MaxText Llama 3 70B, H100 x{gpus}, micro 2, seq 8192, save_qkv_proj as full",
            [
                "cluster=h100_sxm",
                *COMMON,
                *LLAMA3_70B,
                *batch(gpus, 2, 1),
                "data.seq_len=8192",
                "model.max_seq_len=8192",
                "model.activation_checkpointing=full",
            ],
            round(8192 * 2 / step_s),
            "maxtext-h100",
            "held-out",
            differs=[
                MAXTEXT_DIFFERS,
                "Llama 3 70B as Llama 2 70B's shape with Llama 3's vocabulary",
                *([f"hybrid sharding: ZeRO-3 within 128 GPUs, {gpus // 128} replicas"] if gpus > 256 else []),
            ],
        )
        for gpus, step_s in [(128, 15.563), (256, 15.444), (512, 15.519), (1024, 15.603), (2048, 15.898)]
    ),
]


@dataclass(frozen=True)
class Row:
    """One case planned: predicted tokens/s per GPU (None: no step), peak GiB per GPU, fits."""

    tokens_per_gpu: float | None
    memory_gib: float
    fits: bool


def plan_row(run: Published) -> Row:
    """The plan of the run's overrides."""
    from hydra import compose, initialize_config_dir

    from launchers.compose import register_configs, to_train_config
    from runner.plan.planner import plan_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        config = to_train_config(compose(config_name="config", overrides=run.overrides))
    plan = plan_config(config)
    step = plan.time.step_s
    tokens = plan.layout.global_size * plan.workload.seq_len
    speed = None if step is None else tokens / step / plan.layout.gpus
    return Row(speed, plan.memory.peak / GIB, plan.fits)


def main() -> int:
    """Plan every case, print the table by half and one summary line a half."""
    head = f"{'run':70} {'published':>9} {'planned':>9} {'error':>7} {'GiB pub/plan':>13}"
    print(f"{head}  fits (published / planned)")
    summary = []
    for half in ("tuning", "held-out"):
        print(f"-- {half}")
        errors: list[float] = []
        agree = runs = 0
        for run in (r for r in RUNS if r.half == half):
            row = plan_row(run)
            measured = run.tokens_per_gpu
            ran = measured is not None
            runs += 1
            agree += row.fits == ran
            published = "OOM" if measured is None else f"{measured:,.0f}"
            planned = "-" if row.tokens_per_gpu is None else f"{row.tokens_per_gpu:,.0f}"
            error = ""
            if measured is not None and row.tokens_per_gpu is not None and row.fits:
                errors.append((row.tokens_per_gpu - measured) / measured)
                error = f"{100 * errors[-1]:+.1f}%"
            gib = f"{'-' if run.memory_gib is None else f'{run.memory_gib:.1f}'}/{row.memory_gib:.1f}"
            verdict = f"{'ran' if ran else 'OOM'} / {'fits' if row.fits else 'does not fit'}"
            print(f"{run.label:70} {published:>9} {planned:>9} {error:>7} {gib:>13}  {verdict}")
        magnitudes = [abs(e) for e in errors] or [float("nan")]
        summary.append(
            f"{half}: median_abs_err={statistics.median(magnitudes):.3f} max_abs_err={max(magnitudes):.3f} "
            f"fits_agree={agree}/{runs}"
        )
    print("sources:")
    for key, where in SOURCES.items():
        print(f"  {key}: {where}")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
