"""ZeRO 1-2 allocate their gradient bucket during backward, where the plan counts it.

Real DeepSpeed on one CPU rank (tests/multirank/backward_buckets.py): every ``torch.empty``
of the bucket's size made during one backward, against runner.memory.zero12_backward_buckets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from backward_buckets import BUCKET
from train_helpers import ROOT, clean_env

from launchers.local import free_port
from runner.memory import zero12_backward_buckets

pytestmark = pytest.mark.multirank

# Each of stage, precision and overlap_comm takes both values somewhere; stage 3 holds its
# bucket from initialize on (runner.memory.deepspeed_residuals ``ipg_buckets``), none here.
CASES = ["1:fp32:false", "1:bf16:true", "2:fp32:true", "2:bf16:false", "3:fp32:false"]


def test_the_plan_counts_the_buckets_backward_allocates(tmp_path: Path):
    script = Path(__file__).with_name("backward_buckets.py")
    proc = subprocess.run(
        [sys.executable, str(script), *CASES],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean_env(), "PYTHONPATH": str(ROOT), "MASTER_PORT": str(free_port())},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for case in CASES:
        stage, precision, overlap = case.split(":")
        overlap_comm = overlap == "true"
        planned = zero12_backward_buckets(
            zero_stage=int(stage), precision=precision, reduce_bucket_size=BUCKET, overlap_comm=overlap_comm
        )
        assert sum(found[case]) == sum(planned.values()), (case, found[case], planned)
        assert len(found[case]) == (0 if stage == "3" else 2 if overlap_comm else 1), case
