"""Planned vs written bytes of one checkpoint, per layout, and each save's speed: one table, one run.

Trains each layout for 2 steps with ``python train.py``, saving at step 2, and compares the
checkpoint's files with the size runner/checkpoint/size.py gave it (summary.json's
``checkpoint_disk``). The last line is ``max_rel_error=<x>`` over every layout.

    python bench/checkpoint_size.py [--model tiny]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.rundir.disk_room import folder_bytes  # noqa: E402

LAYOUTS = [
    ["gpus=1", "parallel=ddp"],
    ["gpus=2", "parallel=ddp"],
    ["gpus=2", "parallel=zero1"],
    ["gpus=2", "parallel=zero2", "precision=bf16"],
    ["gpus=2", "parallel=zero3"],
    ["gpus=2", "parallel=zero3", "precision=bf16"],
    ["gpus=2", "parallel=zero2_offload", "precision=bf16"],
    ["gpus=2", "parallel=zero1", "parallel.tp=2"],
    ["gpus=2", "parallel=zero1", "parallel.pp=2"],
    ["gpus=2", "parallel=ddp", "parallel.tp=2", "precision=bf16"],
    ["gpus=2", "parallel=ddp", "parallel.pp=2", "precision=bf16"],
    ["gpus=2", "parallel=zero1", "optimizer=sgd"],
]


def main() -> None:
    """Run every layout and print the table and the worst relative error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    columns = ("written MB", "planned MB", "planned/written", "save s", "GB/s")
    print(f"{'layout':<48}" + "".join(f"{column:>{len(column) + 2}}" for column in columns))
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for number, layout in enumerate(LAYOUTS):
            run_dir = Path(tmp) / str(number)
            subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "train.py"),
                    f"model={args.model}",
                    *layout,
                    "batch.global_size=8",
                    "data.seq_len=64",
                    "train.steps=2",
                    "train.checkpoint_every=2",
                    "logger=none",
                    f"hydra.run.dir={run_dir}",
                ],
                check=True,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            summary = json.loads((run_dir / "summary.json").read_text())
            written = folder_bytes(run_dir / "checkpoints" / "step_00000002")
            planned = summary["checkpoint_disk"]["checkpoint_bytes"]
            wall = summary["wall_time"]
            worst = max(worst, abs(planned / written - 1))
            print(
                f"{' '.join(layout):<48}{written / 1e6:>12.2f}{planned / 1e6:>12.2f}"
                f"{planned / written:>17.4f}{wall['checkpoint_s']:>8.2f}{wall['checkpoint_gb_per_s']:>6.2f}"
            )
    print(f"max_rel_error={worst:.4f}")


if __name__ == "__main__":
    main()
