"""Overhead of ladder over a bare DeepSpeed loop: tokens/s side by side, in one run.

Runs ``python train.py`` and a bare DeepSpeed loop (bench/bare_loop.py, under torchrun)
on the same model, DeepSpeed config and ranks, alternating A, B, A, B so that the
machine's drift hits both alike, and compares median step times after warm-up.
Each round's ratio is printed; the last lines give the ratios' min, median and max over
the rounds (a noisy machine shows in their spread), and the last line is
``ratio=<median over rounds of ladder tokens/s / bare tokens/s>``; the goal is >= 0.97.

    python bench/overhead.py [--gpus 2] [--steps 30] [--rounds 4] [overrides...]
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
WARMUP = 3  # steps left out of the median: first-step allocation and thread start


def _ladder(run_dir: Path, gpus: int, steps: int, overrides: list[str]) -> list[float]:
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        f"gpus={gpus}",
        f"train.steps={steps}",
        "logger=none",
        "data=synthetic",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["time/step_s"] for line in lines]


def _bare(run_dir: Path, gpus: int, steps: int) -> list[float]:
    out = run_dir / "bare_times.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={gpus}",
        str(ROOT / "bench" / "bare_loop.py"),
        str(run_dir),
        str(steps),
        str(out),
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times: list[float] = json.loads(out.read_text())
    return times


def main() -> None:
    """Alternate ladder and bare runs; print the table and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=4)
    args, overrides = parser.parse_known_args()
    ladder_times: list[float] = []
    bare_times: list[float] = []
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            run_dir = Path(tmp) / f"ladder{round_index}"
            ladder = _ladder(run_dir, args.gpus, args.steps, overrides)[WARMUP:]
            bare = _bare(run_dir, args.gpus, args.steps)[WARMUP:]
            ladder_times += ladder
            bare_times += bare
            # Same tokens per step on both sides: the tokens/s ratio is the inverse step-time ratio.
            ratios.append(statistics.median(bare) / statistics.median(ladder))
            print(
                f"round {round_index + 1}: ladder median {statistics.median(ladder):.4f} s/step, "
                f"bare median {statistics.median(bare):.4f} s/step, ratio {ratios[-1]:.3f}",
                flush=True,
            )
    ladder_step, bare_step = statistics.median(ladder_times), statistics.median(bare_times)
    print(f"{'':<8}{'s/step (median)':>18}{'steps timed':>14}")
    print(f"{'ladder':<8}{ladder_step:>18.4f}{len(ladder_times):>14}")
    print(f"{'bare':<8}{bare_step:>18.4f}{len(bare_times):>14}")
    low, mid, high = min(ratios), statistics.median(ratios), max(ratios)
    print(f"ratio over {len(ratios)} rounds: min {low:.3f}, median {mid:.3f}, max {high:.3f}")
    print(f"ratio={mid:.3f}")


if __name__ == "__main__":
    main()
