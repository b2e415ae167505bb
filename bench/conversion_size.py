"""Planned vs written bytes of a move to another layout: the copies a resume converts, one run.

Each move trains its source layout for 2 steps with ``python train.py`` (a checkpoint at step
2), then resumes it on the target layout for one step. The resume converts the checkpoint
(DeepSpeed's universal format, and a stage-0 file where the target is ``parallel=ddp``)
beside it; the folder's bytes are sampled as it converts, for the peak. Both are compared
with what runner/checkpoint/size.py planned (summary.json's ``checkpoint_disk``). A sampled
peak can only miss the top (a file removed between two samples): the plan may lie above it.
The last line is ``max_rel_error=<x>`` over the moves' copies as they stay.

    python bench/conversion_size.py [--model tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.rundir.disk_room import folder_bytes  # noqa: E402

MOVES = [
    (["gpus=2", "parallel=zero1"], ["gpus=1", "parallel=zero1"]),
    (["gpus=2", "parallel=zero1"], ["gpus=1", "parallel=ddp"]),
    (["gpus=2", "parallel=zero2", "precision=bf16"], ["gpus=1", "parallel=zero3", "precision=bf16"]),
    (["gpus=2", "parallel=zero3"], ["gpus=1", "parallel=zero2"]),
    (["gpus=2", "parallel=ddp"], ["gpus=1", "parallel=zero1"]),
    (["gpus=2", "parallel=ddp", "parallel.pp=2"], ["gpus=1", "parallel=zero1"]),
    (["gpus=2", "parallel=zero1", "parallel.pp=2"], ["gpus=1", "parallel=zero1"]),
    (["gpus=2", "parallel=ddp", "parallel.tp=2"], ["gpus=2", "parallel=zero1", "parallel.pp=2"]),
    (["gpus=2", "parallel=zero3", "precision=bf16"], ["gpus=2", "parallel=ddp", "precision=bf16"]),
]


class PeakWatch:
    """The most bytes a folder held while a process ran, sampled every few milliseconds."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.peak, self._done = folder, 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            with contextlib.suppress(FileNotFoundError):  # a file removed while it was counted
                self.peak = max(self.peak, folder_bytes(self.folder))
            time.sleep(0.005)

    def __enter__(self) -> PeakWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def _train(run_dir: Path, model: str, layout: list[str], steps: int, *extra: str) -> None:
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            f"model={model}",
            *layout,
            "batch.global_size=8",
            "data.seq_len=64",
            f"train.steps={steps}",
            "train.checkpoint_every=2",
            "train.keep_checkpoints=2",
            "logger=none",
            f"hydra.run.dir={run_dir}",
            *extra,
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    """Run every move and print the table and the worst relative error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    columns = ("source MB", "copies MB", "planned MB", "ratio", "peak MB", "planned MB", "ratio")
    print(f"{'move':<64}" + "".join(f"{column:>{len(column) + 2}}" for column in columns))
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for number, (source, target) in enumerate(MOVES):
            run_dir = Path(tmp) / str(number)
            _train(run_dir, args.model, source, 2)
            checkpoints = run_dir / "checkpoints"
            before = folder_bytes(checkpoints)
            with PeakWatch(checkpoints) as watch:
                _train(run_dir, args.model, target, 3, "train.resume=auto")
            copies = sum(
                folder_bytes(folder)
                for folder in checkpoints.iterdir()
                if folder.is_dir() and folder.name.startswith("step_00000002_")
            )
            planned = json.loads((run_dir / "summary.json").read_text())["checkpoint_disk"]["conversion"]
            peak = watch.peak - before
            ratios = (planned["bytes"] / copies, planned["peak_bytes"] / peak)
            worst = max(worst, abs(ratios[0] - 1))
            move = f"{' '.join(source)} -> {' '.join(target)}"
            print(
                f"{move:<64}{before / 1e6:>11.2f}{copies / 1e6:>11.2f}{planned['bytes'] / 1e6:>12.2f}"
                f"{ratios[0]:>7.3f}{peak / 1e6:>9.2f}{planned['peak_bytes'] / 1e6:>12.2f}{ratios[1]:>7.3f}"
            )
    print(f"max_rel_error={worst:.4f}")


if __name__ == "__main__":
    main()
