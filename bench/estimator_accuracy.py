"""Estimated vs measured bytes per memory term, per layout, on 2 CPU ranks: one table, one run.

Trains each layout for 2 steps with ``python train.py`` and reads the ledger from its
summary.json. The last line is ``max_rel_error=<x>`` over params, grads, optimizer and
activations of every layout.

    python bench/estimator_accuracy.py [--models tiny,gpt2_124m] [--gpus 1,2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TERMS = ("params", "grads", "optimizer", "activations")
# A mid-size model stays affordable on a CPU with short sequences and one sequence per micro-batch.
MODEL_ARGS = {
    "tiny": ["batch.global_size=8", "batch.micro_size=2"],
    "gpt2_124m": ["batch.global_size=2", "batch.micro_size=1", "data.seq_len=64"],
}


def _measure(run_dir: Path, overrides: list[str]) -> dict:
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        *overrides,
        "train.steps=2",
        "logger=none",
        f"hydra.run.dir={run_dir}",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((run_dir / "summary.json").read_text())["memory"]


def main() -> None:
    """Run every layout and print the table and the worst relative error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,gpt2_124m")
    parser.add_argument("--gpus", default="1,2")
    parser.add_argument("--parallel", default="ddp,zero1,zero2,zero3")
    parser.add_argument("--precision", default="fp32,bf16")
    args = parser.parse_args()
    worst = 0.0
    header = f"{'model':<10}{'layout':<8}{'gpus':>5}{'prec':>6}" + "".join(
        f"{t + ' est/meas GB':>26}" for t in TERMS
    )
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        cell = 0
        for model in args.models.split(","):
            for gpus in args.gpus.split(","):
                for parallel in args.parallel.split(","):
                    for precision in args.precision.split(","):
                        cell += 1
                        overrides = [
                            f"model={model}",
                            f"gpus={gpus}",
                            f"parallel={parallel}",
                            f"precision={precision}",
                            *MODEL_ARGS.get(model, []),
                        ]
                        memory = _measure(Path(tmp) / str(cell), overrides)
                        cols = []
                        for term in TERMS:
                            est, meas = memory["estimated"][f"{term}_gb"], memory["measured"][f"{term}_gb"]
                            error = memory["rel_error"][term]
                            if error is not None:
                                worst = max(worst, abs(error))
                            cols.append(
                                f"{est:>11.4f} /{meas:>9.4f}{'' if error is None else f' {error:+.1%}':>6}"
                            )
                        print(
                            f"{model:<10}{parallel:<8}{gpus:>5}{precision:>6}"
                            + "".join(f"{c:>26}" for c in cols),
                            flush=True,
                        )
    print(f"max_rel_error={worst:.4f}")


if __name__ == "__main__":
    main()
