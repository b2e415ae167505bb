"""Each technique of the ladder beside the plain layout: measured memory per term, tokens/s, losses.

One run, one table. Every row trains the same experiment (tiny model, fp32 or with
``--precision bf16`` bf16, global batch 16, the same seed and data) on 2 CPU ranks with
``python train.py`` and reads its summary.json and metrics.jsonl:

- the measured ledger per rank (params, grads, optimizer states, activations of one
  micro-batch) and what the ledger places in host memory (offload);
- median tokens/s and median exposed communication (``time/comm_exposed_s``) over the
  steps after the first two;
- the largest |loss difference| from the plain layout over all steps.

Each technique names the term it exists to shrink; the check is that the measured term
is below the plain layout's (offload: that the term moved to host memory) and that the
losses agree within the tolerance. The last line is ``ok`` or the failed checks.

    python bench/techniques.py [--steps 8] [--only plain,zero3,tp2] [--precision bf16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TERMS = ("params", "grads", "optimizer", "activations")
COMMON = [
    "gpus=2",
    "model=tiny",
    "data=synthetic",
    "batch.global_size=16",
    "batch.micro_size=4",
    "optimizer.lr=1e-3",
    "logger=none",
]
MODEL_STATES = ("params", "grads", "optimizer")
LOSS_TOLERANCE = 1e-5  # fp32: reduction order only (tests/multirank/test_layout_invariance.py)
# bf16: a layout's other reduction order moves a master weight across a bf16 rounding
# boundary now and then (tests/multirank/test_layout_invariance.py BF16_TOLERANCE).
BF16_LOSS_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Technique:
    """One row: its overrides, the terms it shrinks, and how it may differ in loss."""

    name: str
    overrides: list[str]
    shrinks: tuple[str, ...] = ()
    to_host: tuple[str, ...] = ()  # terms the ledger must show in host memory
    loss_tolerance: float = LOSS_TOLERANCE
    note: str = ""


TECHNIQUES = [
    Technique("plain", ["parallel=ddp"], note="ZeRO-0, dp 2"),
    Technique("zero1", ["parallel=zero1"], shrinks=("optimizer",)),
    Technique("zero2", ["parallel=zero2"], shrinks=("grads", "optimizer")),
    Technique("zero3", ["parallel=zero3"], shrinks=("params", "grads", "optimizer")),
    Technique(
        "zero2_overlap",
        ["parallel=zero2", "parallel.overlap_comm=true", "parallel.reduce_bucket_size=200000"],
        shrinks=("grads", "optimizer"),
        note="overlap_comm, small buckets",
    ),
    Technique(
        "zero2_offload",
        ["parallel=zero2_offload"],
        to_host=("optimizer",),
        loss_tolerance=1e-4,
        note="DeepSpeedCPUAdam steps on the host",
    ),
    Technique(
        "zero3_offload",
        ["parallel=zero3_offload"],
        to_host=("params", "optimizer"),
        loss_tolerance=1e-4,
        note="DeepSpeedCPUAdam steps on the host",
    ),
    Technique(
        "ac_selective", ["parallel=ddp", "model.activation_checkpointing=selective"], shrinks=("activations",)
    ),
    Technique(
        "ac_attention", ["parallel=ddp", "model.activation_checkpointing=attention"], shrinks=("activations",)
    ),
    Technique("ac_full", ["parallel=ddp", "model.activation_checkpointing=full"], shrinks=("activations",)),
    Technique(
        "tp2", ["parallel=ddp", "parallel.tp=2"], shrinks=("params", "grads", "optimizer"), note="dp 1"
    ),
    Technique(
        "pp2", ["parallel=ddp", "parallel.pp=2"], shrinks=("params", "grads", "optimizer"), note="dp 1"
    ),
]


@dataclass
class Row:
    """What one technique's run left."""

    technique: Technique
    status: str
    error: str = ""
    measured: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    tokens_per_s: float = float("nan")
    comm_ms: float = float("nan")


def _run(technique: Technique, run_dir: Path, steps: int, precision: str) -> Row:
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        *COMMON,
        f"precision={precision}",
        *technique.overrides,
        f"train.steps={steps}",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Row(technique, "refused" if not (run_dir / "summary.json").exists() else "failed", last)
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = metrics[2:] or metrics
    memory = summary["memory"]
    return Row(
        technique,
        "ok",
        measured={term: memory["measured"][f"{term}_gb"] for term in TERMS},
        # Every host line: the offloaded terms and DeepSpeed's own host buffers.
        host={name.removesuffix("_gb"): gb for name, gb in memory["offloaded_to_host"].items()},
        losses=[m["loss"] for m in metrics],
        tokens_per_s=statistics.median(m["throughput/tokens_per_s"] for m in timed),
        comm_ms=statistics.median(float(m["time/comm_exposed_s"]) for m in timed) * 1e3,  # "nan" on CUDA
    )


def _checks(row: Row, plain: Row, precision: str) -> list[str]:
    """The failed checks of one row against the plain layout."""
    name = row.technique.name
    if row.status != "ok":
        return [f"{name}: {row.status}: {row.error}"]
    failed = [
        f"{name}: measured {term} {row.measured[term]:.4f} GB is not below plain's {plain.measured[term]:.4f}"
        for term in row.technique.shrinks
        if not row.measured[term] < plain.measured[term]
    ]
    failed += [
        f"{name}: the ledger shows no {term} in host memory"
        for term in row.technique.to_host
        if not row.host.get(term, 0.0) > 0
    ]
    gap = max(abs(a - b) for a, b in zip(row.losses, plain.losses, strict=True))
    tolerance = row.technique.loss_tolerance
    if precision == "bf16":
        tolerance = max(tolerance, BF16_LOSS_TOLERANCE)
    if gap > tolerance:
        failed.append(f"{name}: losses differ from plain's by {gap:.2e} > {tolerance:g}")
    return failed


def _print(rows: list[Row], plain: Row) -> None:
    mb = 1e3  # GB -> MB for a readable tiny model
    print(
        f"{'technique':<15}{'params':>8}{'grads':>8}{'optim':>8}{'activ':>8}{'host':>8}"
        f"{'tok/s':>8}{'x plain':>8}{'comm ms':>9}{'|dloss|':>10}  note"
    )
    print(f"{'':<15}{'MB per rank, measured':^40}")
    for row in rows:
        t = row.technique
        if row.status != "ok":
            print(f"{t.name:<15}{row.status}: {row.error[:90]}")
            continue
        gap = max(abs(a - b) for a, b in zip(row.losses, plain.losses, strict=True))
        print(
            f"{t.name:<15}"
            + "".join(f"{row.measured[term] * mb:>8.2f}" for term in TERMS)
            + f"{sum(row.host.values()) * mb:>8.2f}{row.tokens_per_s:>8.0f}"
            f"{row.tokens_per_s / plain.tokens_per_s:>8.2f}{row.comm_ms:>9.1f}{gap:>10.1e}  {t.note}"
        )


def main() -> None:
    """Run the plain layout and each technique, print the table, then ``ok`` or what failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--only", default="", help="comma-separated technique names (plain always runs)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    wanted = set(args.only.split(",")) if args.only else {t.name for t in TECHNIQUES}
    chosen = [t for t in TECHNIQUES if t.name == "plain" or t.name in wanted]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [_run(t, Path(tmp) / t.name, args.steps, args.precision) for t in chosen]
    plain = rows[0]
    if plain.status != "ok":
        print(f"the plain layout did not run: {plain.error}")
        sys.exit(1)
    _print(rows, plain)
    failed = [problem for row in rows[1:] for problem in _checks(row, plain, args.precision)]
    print("ok" if not failed else "FAILED\n" + "\n".join(failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
