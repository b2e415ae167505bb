"""Plan many layouts with ``plan=true`` and write what each printed, its plan.json and exit code.

A refactor that moves code and changes no behaviour leaves this dump byte-identical:

    python scripts/plan_dump.py /tmp/before     # on the commit before
    python scripts/plan_dump.py /tmp/after      # on the commit after
    diff -r /tmp/before /tmp/after

Each sweep is one Hydra multirun (``-m plan=true``), one process; the cells' log lines lose their
timestamps and the sweep's folder its name, which differ run to run and say nothing of the plan.
The CPU's peak (which a ``cluster=local`` plan divides by) is measured once into a cache of the
dumps' own and then kept, and the disk's free space is masked. The sweeps cover every parallel
option, recompute mode and offload at 8 and 64 GPUs on three published models and three GPU
clusters, tensor and pipeline cuts, sequence parallelism at 131K tokens, the ladder
(``planner.recommend``), ``planner.max_seq`` and plans that do not fit or miss the contract.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SWEEPS: dict[str, list[str]] = {
    "published": [
        "model=llama_7b,llama3_1_8b,llama_70b",
        "cluster=h100_sxm",
        "precision=bf16",
        "parallel=ddp,zero1,zero2,zero3,zero3_offload",
        "gpus=8,64",
        "model.activation_checkpointing=none,selective,full",
        "data.seq_len=4096",
        "batch.global_size=512",
    ],
    "clusters": [
        "model=llama_7b",
        "cluster=a100_80g,h200",
        "precision=bf16,fp32",
        "parallel=zero2,zero3",
        "gpus=16",
        "data.seq_len=2048",
        "batch.global_size=256",
    ],
    "cuts": [
        "model=llama_70b",
        "cluster=h100_sxm",
        "precision=bf16",
        "parallel=tp2,pp2,tp2pp2",
        "gpus=16,32",
        "data.seq_len=4096",
        "batch.global_size=128",
    ],
    "ladder": [
        "model=llama3_1_8b,llama_70b",
        "cluster=h100_sxm",
        "precision=bf16",
        "gpus=8,64",
        "data.seq_len=8192",
        "batch.global_size=256",
        "planner.recommend=true",
    ],
    "max_seq": [
        "model=llama3_1_8b",
        "cluster=h100_sxm",
        "precision=bf16",
        "parallel=zero3",
        "gpus=8",
        "batch.micro_size=1",
        "batch.global_size=8",
        "planner.max_seq=true",
    ],
    "long_context": [
        "model=llama3_1_8b",
        "cluster=h100_sxm",
        "precision=bf16",
        "parallel=zero1,zero3",
        "parallel.sp=2,8",
        "gpus=8",
        "model.activation_checkpointing=selective,full",
        "model.max_seq_len=1048576",
        "data.seq_len=131072",
        "batch.global_size=8",
        "batch.micro_size=1",
    ],
    "local": [
        "parallel=ddp,zero1,zero2,zero3,zero2_offload,tp2,pp2",
        "gpus=2",
        "precision=fp32,bf16",
        "batch.micro_size=auto,4",
    ],
    "contract": [
        "parallel=zero3",
        "gpus=3,6",
        "batch.global_size=16",
        "batch.micro_size=4",
    ],
}

TIMESTAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]", re.MULTILINE)
FREE_SPACE = re.compile(r"[\d.]+ GB free on the filesystem")
FREE_BYTES = re.compile(r'"free_bytes": \d+')


def _steady(text: str, runs: Path) -> str:
    """``text`` less what differs run to run or checkout to checkout: log timestamps, the sweep
    folder, the repository's folder, the disk's free space."""
    text = TIMESTAMP.sub("[time]", text).replace(str(runs), "<runs>").replace(str(ROOT), "<repo>")
    return FREE_BYTES.sub('"free_bytes": <free>', FREE_SPACE.sub("<free> GB free on the filesystem", text))


def dump(sweep: str, overrides: list[str], out: Path) -> None:
    folder = out / sweep
    folder.mkdir(parents=True)
    runs = folder / "runs"
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", "plan=true", *overrides, f"hydra.sweep.dir={runs}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "HYDRA_FULL_ERROR": "1"},
    )
    said = _steady(proc.stdout + "\n--- stderr\n" + proc.stderr, runs)
    (folder / "output.txt").write_text(f"exit {proc.returncode}\n{said}")
    for plan_file in sorted(runs.glob("*/plan.json")):
        plan = json.loads(plan_file.read_text())
        text = _steady(json.dumps(plan, indent=1, sort_keys=True), runs)
        (folder / f"plan_{plan_file.parent.name}.json").write_text(text)
    shutil.rmtree(runs)
    print(f"{sweep}: exit {proc.returncode}, {len(list(folder.glob('plan_*.json')))} plans", flush=True)


def main() -> int:
    out = Path(sys.argv[1])
    if out.exists():
        raise SystemExit(f"{out} exists: name a new folder")
    os.environ.setdefault("LADDER_CALIBRATION", str(ROOT / "tests" / "data" / "cpu_calibration.json"))
    # One CPU peak for every dump on this machine: the CPU cluster's plans divide by it.
    os.environ.setdefault("LADDER_CACHE_DIR", str(Path.home() / ".cache" / "ladder-plan-dump"))
    for sweep, overrides in SWEEPS.items():
        dump(sweep, overrides, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
