"""Predicted against measured step time, per layout, on this machine: one table, one run.

Each layout trains for a few steps with ``python train.py`` (logger=none); its measured step
time is the median of ``time/step_s`` after the first step (the report's median). Its
predicted step time is ``plan=true``'s for the same overrides (plan.json ``time.step_s``:
runner/step_time/estimate.py, on this device's calibration). Layouts: 1 and 2 ranks; ddp and
ZeRO 1-3; two micro-batch sizes; recompute none and full; tiny and gpt2_124m in fp32.

    python bench/time_model_accuracy.py [--rounds 1] [--only tiny] [--save runs.json]
    python bench/time_model_accuracy.py --measured runs.json   # predict again, no training
    python bench/time_model_accuracy.py --keep runs/   # keep each run's directory (metrics.jsonl)

The last line is ``median_abs_err=<x> max_abs_err=<y> rank_corr=<z>``: relative errors of
predicted against measured (|p - m| / m), and Spearman's rank correlation between them. With
``--rounds N`` every layout is measured N times and its median taken; the spread per layout
(max - min over min) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = ["model=tiny", "batch.global_size=16", "data.seq_len=128"]
GPT2 = ["model=gpt2_124m", "batch.global_size=4", "data.seq_len=128"]
# name: (overrides, steps). Every layout holds the global batch of its model fixed.
LAYOUTS: dict[str, tuple[list[str], int]] = {
    "tiny 1 ddp m8": ([*TINY, "gpus=1", "parallel=ddp", "batch.micro_size=8"], 12),
    "tiny 1 ddp m4": ([*TINY, "gpus=1", "parallel=ddp", "batch.micro_size=4"], 12),
    "tiny 1 ddp m8 full": (
        [*TINY, "gpus=1", "parallel=ddp", "batch.micro_size=8", "model.activation_checkpointing=full"],
        12,
    ),
    "tiny 1 zero1 m8": ([*TINY, "gpus=1", "parallel=zero1", "batch.micro_size=8"], 12),
    "tiny 1 zero2 m4": ([*TINY, "gpus=1", "parallel=zero2", "batch.micro_size=4"], 12),
    "tiny 1 zero3 m8": ([*TINY, "gpus=1", "parallel=zero3", "batch.micro_size=8"], 12),
    "tiny 2 ddp m4": ([*TINY, "gpus=2", "parallel=ddp", "batch.micro_size=4"], 12),
    "tiny 2 zero1 m8": ([*TINY, "gpus=2", "parallel=zero1", "batch.micro_size=8"], 12),
    "tiny 2 zero2 m4 full": (
        [*TINY, "gpus=2", "parallel=zero2", "batch.micro_size=4", "model.activation_checkpointing=full"],
        12,
    ),
    "tiny 2 zero3 m4": ([*TINY, "gpus=2", "parallel=zero3", "batch.micro_size=4"], 12),
    "gpt2 1 ddp m2": ([*GPT2, "gpus=1", "parallel=ddp", "batch.micro_size=2"], 6),
    "gpt2 1 zero3 m2 full": (
        [*GPT2, "gpus=1", "parallel=zero3", "batch.micro_size=2", "model.activation_checkpointing=full"],
        6,
    ),
    "gpt2 2 ddp m1": ([*GPT2, "gpus=2", "parallel=ddp", "batch.micro_size=1"], 6),
    "gpt2 2 zero2 m2": ([*GPT2, "gpus=2", "parallel=zero2", "batch.micro_size=2"], 6),
    "gpt2 2 zero3 m1 full": (
        [*GPT2, "gpus=2", "parallel=zero3", "batch.micro_size=1", "model.activation_checkpointing=full"],
        6,
    ),
}


def _train(run_dir: Path, overrides: list[str], steps: int) -> float:
    """The layout's median step time after the first step, measured by a real run."""
    command = [sys.executable, str(ROOT / "train.py"), *overrides, f"train.steps={steps}", "logger=none"]
    command.append(f"hydra.run.dir={run_dir}")
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    times = [json.loads(line)["time/step_s"] for line in lines if '"time/step_s"' in line]
    return statistics.median(times[1:])


def _predict(run_dir: Path, overrides: list[str]) -> dict:
    """plan=true's predicted step for the same overrides (plan.json's ``time``)."""
    command = [sys.executable, str(ROOT / "train.py"), *overrides, "plan=true", "logger=none"]
    command.append(f"hydra.run.dir={run_dir}")
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((run_dir / "plan.json").read_text())["time"]


def _ranks(values: list[float]) -> list[float]:
    """Ranks (1 = smallest), ties given their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def main() -> None:
    """Measure (or load) every layout, predict each, print the table and the summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs per layout; the median is kept")
    parser.add_argument("--only", default="", help="layouts whose name contains this")
    parser.add_argument("--save", type=Path, help="write the measured step times here (JSON)")
    parser.add_argument("--measured", type=Path, help="read measured step times from here; train nothing")
    parser.add_argument("--keep", type=Path, help="keep the runs' directories here (their metrics.jsonl)")
    args = parser.parse_args()
    layouts = {name: spec for name, spec in LAYOUTS.items() if args.only in name}
    measured: dict[str, list[float]] = json.loads(args.measured.read_text()) if args.measured else {}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = str(args.keep) if args.keep else scratch
        if not args.measured:
            for round_ in range(args.rounds):
                for index, (name, (overrides, steps)) in enumerate(layouts.items()):
                    run_dir = Path(tmp) / f"run{round_}_{index}_{name.replace(' ', '_')}"
                    measured.setdefault(name, []).append(_train(run_dir, overrides, steps))
                    print(f"round {round_ + 1}: {name}: {measured[name][-1]:.3f} s", flush=True)
            if args.save:
                args.save.write_text(json.dumps(measured, indent=1))
        print(f"{'layout':<24}{'measured s':>11}{'spread':>8}{'predicted s':>12}{'error':>8}  limit")
        errors, kept_m, kept_p = [], [], []
        for index, (name, (overrides, _steps)) in enumerate(layouts.items()):
            if name not in measured:
                continue
            times = measured[name]
            median = statistics.median(times)
            spread = (max(times) - min(times)) / min(times)
            time = _predict(Path(tmp) / f"plan{index}", overrides)
            predicted = time["step_s"]
            error = (predicted - median) / median
            errors.append(abs(error))
            kept_m.append(median)
            kept_p.append(predicted)
            limit = time.get("limit") or ""
            print(
                f"{name:<24}{median:>11.3f}{100 * spread:>7.0f}%{predicted:>12.3f}"
                f"{100 * error:>+7.0f}%  {limit}"
            )
    print(
        f"median_abs_err={statistics.median(errors):.3f} max_abs_err={max(errors):.3f} "
        f"rank_corr={spearman(kept_m, kept_p):.3f}"
    )


if __name__ == "__main__":
    main()
