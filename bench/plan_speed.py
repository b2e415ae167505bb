"""How fast the planner answers a sweep: 100 cells in-process, and one real ``train.py -m`` multirun.

In-process: 4 parallel options x 25 gpu counts of llama_70b on h100_sxm, each cell run
through ``launchers.run.run`` with ``plan=true``, the function the Hydra job calls (it
validates, plans, prints the table and writes plan.json). Hydra composes 4 configs
once (timed apart); the 25 gpu counts are ``dataclasses.replace`` of those.

End to end: ``python train.py -m plan=true model=llama_70b parallel=ddp,zero1,zero2,zero3
gpus=8,64 cluster=h100_sxm`` (8 cells) in a fresh interpreter, timed from outside: the
interpreter start and torch import, then Hydra's composition of each cell, dominate.

The last line is ``seconds=<in-process seconds for the 100 cells>``; the goal is < 5.

    python bench/plan_speed.py [--recommend] [--no-e2e]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARALLEL = ("ddp", "zero1", "zero2", "zero3")
GPUS = tuple(8 * k for k in range(1, 26))  # 8 .. 200: 25 counts, most of them multi-node
BASE = (
    "model=llama_70b",
    "cluster=h100_sxm",
    "precision=bf16",
    "data.seq_len=4096",
    "batch.global_size=1024",
)


def _compose(recommend: bool) -> list:
    from hydra import compose, initialize_config_dir

    from launchers.compose import register_configs, to_train_config

    register_configs()
    extra = ["plan=true"] + (["planner.recommend=true"] if recommend else [])
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return [
            to_train_config(compose(config_name="config", overrides=[*BASE, f"parallel={p}", *extra]))
            for p in PARALLEL
        ]


def in_process(recommend: bool) -> tuple[float, float, int]:
    """(compose seconds, plan seconds, cells) for 100 cells through launchers.run.run."""
    from launchers.run import run
    from runner.rundir.identity import RunIdentity

    t0 = time.perf_counter()
    configs = _compose(recommend)
    composed = time.perf_counter() - t0
    cells = [dataclasses.replace(c, gpus=g) for c in configs for g in GPUS]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            for i, config in enumerate(cells):
                run_dir = Path(tmp) / str(i)
                run(
                    config,
                    run_dir=run_dir,
                    identity=RunIdentity.for_run_dir(run_dir, name=str(i), group="bench"),
                )
        planned = time.perf_counter() - start
        assert len(list(Path(tmp).glob("*/plan.json"))) == len(cells)
    return composed, planned, len(cells)


def end_to_end() -> tuple[float, int]:
    """Wall seconds of one real 8-cell ``train.py -m plan=true`` multirun, and its plan.json count."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            str(ROOT / "train.py"),
            "-m",
            "plan=true",
            "model=llama_70b",
            "parallel=ddp,zero1,zero2,zero3",
            "gpus=8,64",
            "cluster=h100_sxm",
            f"hydra.sweep.dir={tmp}/sweep",
        ]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode not in (0, 3, 4):  # a sweep of plans exits with its worst verdict: 3, 4
            raise RuntimeError(f"train.py -m plan=true exited {proc.returncode}: {proc.stderr[-2000:]}")
        return time.perf_counter() - start, len(list(Path(tmp).glob("sweep/*/plan.json")))


def main() -> None:
    """Time the in-process sweep (and the real multirun); print the figures, last line seconds=."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recommend", action="store_true", help="walk the ladder in every cell too")
    parser.add_argument("--no-e2e", action="store_true", help="skip the real train.py -m multirun")
    args = parser.parse_args()
    composed, planned, cells = in_process(args.recommend)
    what = "plan + ladder" if args.recommend else "plan"
    print(f"in-process: {cells} cells ({what}, table, plan.json) in {planned:.3f} s", end="")
    print(f" = {1000 * planned / cells:.1f} ms/cell; composing the 4 base configs took {composed:.2f} s")
    if not args.no_e2e:
        wall, written = end_to_end()
        print(f"end to end: python train.py -m plan=true ... ({written} cells) took {wall:.1f} s wall")
    print(f"seconds={planned:.3f}")


if __name__ == "__main__":
    main()
