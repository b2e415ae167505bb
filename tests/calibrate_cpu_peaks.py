"""The CPU's MFU peaks that the suite's runs divide by, calibrated once before the tiers start.

``make test`` runs this first, while nothing else runs: the tiers, the cluster tiers and the
checks then start together and keep both cores busy for the whole session, so a calibration
made by the first run that needs it reads low and stays provisional (runner/hardware/mfu_peak.py:
calibrated again only once a run finds the cores quiet, which in the suite they never are). A run
dividing by such a figure reports an MFU above 1 (seen: 5.9 on one host). This measures every key
the suite's ranks ask for (each precision, at the threads of a rank of 1, 2 and 4 ranks on this
host: runner/engine/distributed.py cpu_threads) into the suite's cache (tests/conftest.py), where
every later process finds it. A key already kept and settled is not measured again.

    python tests/calibrate_cpu_peaks.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LADDER_CACHE_DIR", str(ROOT / ".pytest_cache" / "ladder"))

RANKS_ON_ONE_HOST = (1, 2, 4)


def main() -> int:
    import torch

    from runner.config import Precision
    from runner.engine.distributed import cpu_threads
    from runner.hardware.mfu_peak import best_cpu_peak

    for threads in sorted({cpu_threads(ranks) for ranks in RANKS_ON_ONE_HOST}, reverse=True):
        torch.set_num_threads(threads)
        for precision in Precision:
            peak = best_cpu_peak(precision)
            state = "provisional (busy cores)" if (peak.detail or {}).get("busy") else "kept"
            figure = f"{peak.flops / 1e9:.1f} GFLOP/s"
            print(f"cpu peak: {precision.value} on {threads} thread(s): {figure}, {state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
