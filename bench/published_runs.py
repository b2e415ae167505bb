"""The plan against published training runs: tokens/s per GPU and whether each fits, one table.

Each row is a run a peer published with its layout and its measured speed (or its out-of-memory),
planned here with ``plan=true``'s planner (runner/plan/planner.py ``plan_config``, in this
process; the datasheet clusters measure nothing on this host). Printed: the predicted tokens/s
per GPU beside the published one and the error (p - m) / m, and the plan's fit beside the
published outcome. The loss runs whole (``model.loss_tiles=1``), as in every run listed.

    python bench/published_runs.py

Source: torchtitan's docs/performance.md (pytorch/torchtitan, commit 041336434916), FSDP2
(ZeRO-3's sharding) on 64 A100 80GB, bf16, one sequence per GPU per micro-batch as listed,
Llama 3 at 8,192 tokens and Llama 2 at 4,096. "selective op" is torchtitan's op-level selective
activation checkpointing, ladder's ``model.activation_checkpointing=selective``. Llama 3 70B is
Llama 2 70B's shape with Llama 3's vocabulary of 128,256.

The last line is ``median_abs_err=<x> max_abs_err=<y> fits_agree=<a>/<n>``.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TORCHTITAN_A100 = "torchtitan docs/performance.md (64 A100 80GB, FSDP2)"
A100_64 = ["cluster=a100_80g", "gpus=64", "parallel=zero3", "precision=bf16", "model.loss_tiles=1"]
LLAMA3_70B = ["model=llama_70b", "model.vocab_size=128256", "model.rope_theta=500000"]


@dataclass
class Published:
    """One published run: its overrides here, its tokens/s per GPU (None: it ran out of memory)."""

    label: str
    overrides: list[str]
    tokens_per_gpu: float | None
    source: str


RUNS = [
    Published(
        "Llama 3 8B, micro 1, seq 8192, selective op",
        [
            *A100_64,
            "model=llama3_8b",
            "batch.micro_size=1",
            "batch.global_size=64",
            "data.seq_len=8192",
            "model.activation_checkpointing=selective",
        ],
        2973,
        TORCHTITAN_A100,
    ),
    Published(
        "Llama 3 70B, micro 1, seq 8192, full",
        [
            *A100_64,
            *LLAMA3_70B,
            "batch.micro_size=1",
            "batch.global_size=64",
            "data.seq_len=8192",
            "model.max_seq_len=8192",
            "model.activation_checkpointing=full",
        ],
        331,
        TORCHTITAN_A100,
    ),
    Published(
        "Llama 2 70B, micro 1, seq 4096, selective op",
        [
            *A100_64,
            "model=llama_70b",
            "batch.micro_size=1",
            "batch.global_size=64",
            "data.seq_len=4096",
            "model.activation_checkpointing=selective",
        ],
        355,
        TORCHTITAN_A100,
    ),
    Published(
        "Llama 2 70B, micro 2, seq 4096, full",
        [
            *A100_64,
            "model=llama_70b",
            "batch.micro_size=2",
            "batch.global_size=128",
            "data.seq_len=4096",
            "model.activation_checkpointing=full",
        ],
        353,
        TORCHTITAN_A100,
    ),
    Published(
        "Llama 2 70B, micro 2, seq 4096, selective op: out of memory",
        [
            *A100_64,
            "model=llama_70b",
            "batch.micro_size=2",
            "batch.global_size=128",
            "data.seq_len=4096",
            "model.activation_checkpointing=selective",
        ],
        None,
        TORCHTITAN_A100 + ", footnote 1",
    ),
]


def plan_row(run: Published) -> tuple[float | None, bool]:
    """(predicted tokens/s per GPU, fits) of the run's overrides."""
    from hydra import compose, initialize_config_dir

    from launchers.compose import register_configs, to_train_config
    from runner.plan.planner import plan_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        config = to_train_config(compose(config_name="config", overrides=run.overrides))
    plan = plan_config(config)
    step = plan.time.step_s
    tokens = plan.layout.global_size * plan.workload.seq_len
    return (None if step is None else tokens / step / plan.layout.gpus), plan.fits


def main() -> int:
    errors: list[float] = []
    agree = 0
    print(f"{'run':58} {'published':>10} {'planned':>10} {'error':>8}  fits (published / planned)")
    for run in RUNS:
        predicted, fits = plan_row(run)
        measured = run.tokens_per_gpu
        ran = measured is not None
        agree += fits == ran
        published = "OOM" if measured is None else f"{measured:,.0f}"
        planned = "-" if predicted is None else f"{predicted:,.0f}"
        error = ""
        if measured is not None and predicted is not None and fits:
            errors.append((predicted - measured) / measured)
            error = f"{100 * errors[-1]:+.1f}%"
        verdict = f"{'ran' if ran else 'OOM'} / {'fits' if fits else 'does not fit'}"
        print(f"{run.label:58} {published:>10} {planned:>10} {error:>8}  {verdict}")
    print(f"sources: {'; '.join(sorted({run.source for run in RUNS}))}")
    magnitudes = [abs(e) for e in errors]
    print(
        f"median_abs_err={statistics.median(magnitudes):.3f} max_abs_err={max(magnitudes):.3f} "
        f"fits_agree={agree}/{len(RUNS)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
