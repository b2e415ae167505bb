"""What DeepSpeed's Muon import costs a ZeRO rank, plain and as ladder imports it, side by side.

Every ZeRO rank imports ``deepspeed.runtime.zero.muon.original_muon`` whatever its optimizer
(runner/engine/fixes/muon_compiles_at_import.py). Each round starts two fresh interpreters that import torch,
DeepSpeed and torch._dynamo (what a rank has by its engine) and then the Muon module: one
plainly, as DeepSpeed does, one through ``import_muon_deferred``. Alternating A, B, A, B
lets the machine's drift hit both alike. Each prints the seconds of the Muon import and its
high-water RSS; the last line is ``ratio=<deferred seconds / plain seconds>``.

    python bench/muon_import.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import json, resource, sys, time
import torch, deepspeed, torch._dynamo
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if sys.argv[1] == "deferred":
    from runner.engine.fixes.muon_compiles_at_import import import_muon_deferred
    import_muon_deferred()
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam  # as DeepSpeed imports it
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "rss_kib": after - before,
                  "inductor": "torch._inductor.compile_fx" in sys.modules}))
"""


def _probe(mode: str) -> dict[str, float]:
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "deferred": []}
    for _ in range(args.rounds):
        for mode in runs:
            runs[mode].append(_probe(mode))
    print(f"{'import':10} {'median s':>9} {'RSS rise MB':>12}  TorchInductor imported")
    medians = {}
    for mode, results in runs.items():
        medians[mode] = statistics.median(r["seconds"] for r in results)
        rss = statistics.median(r["rss_kib"] for r in results) * 1024 / 1e6
        print(f"{mode:10} {medians[mode]:9.3f} {rss:12.1f}  {all(r['inductor'] for r in results)}")
    print(f"ratio={medians['deferred'] / medians['plain']:.3f}")


if __name__ == "__main__":
    main()
