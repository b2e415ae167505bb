"""plan=true's peak against the allocator's peak of a real run (bench/step_peak.py).

One DeepSpeed rank on the CPU, the tiny model in fp32, micro 8, seq 128: every allocation
and free from the model's build to the end of two steps, from torch.profiler's memory
events, the way a GPU's allocator counts them. The cases are the ones where what is live
at the peak is not the sum of the terms: one micro-batch a step at ZeRO-0 and ZeRO-2
(the gradients come after the activation peak; ZeRO-2's bucket and the tied head's
gradient at the head's backward) and ZeRO-1 with accumulation (its bucket held to the
step's boundary). Measured 0.988, 0.977 and 0.995 of the allocator's peak; counting the
gradients whole, one micro-batch a step planned 1.082 and 1.056 of it. The peak can move by
a stray tensor freed late (once in bf16 at ZeRO-0: its 6.5 MB of gradients still live at
the next step's loss), hence 10% under, the plan's goal on a GPU too.

Under a pipeline (2 stages, 2 ranks under torchrun, 4 micro-batches a step) the fullest
rank's peak against the plan's fullest stage: measured 1.003 (0.928 before the plan counted
a block's backward working set and the first stage's gradient receive buffer), so 5% both ways.

With a tied vocabulary that outweighs the blocks (tiny with V = 32000, micro 4, seq 64) the
peak comes as the weight's two gradients join at the end of backward: measured 0.999 at
ZeRO-1 and ZeRO-2 (0.897 and 0.932 before the plan counted the join), so 3% both ways.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from train_helpers import ROOT, clean_env

from launchers.local import free_port

pytestmark = pytest.mark.multirank

CASES = [("0", "1"), ("2", "1"), ("1", "2")]  # (ZeRO stage, micro-batches a step)
SCRIPT = ROOT / "bench" / "step_peak.py"


def _start(*case: str, ranks: int = 1) -> subprocess.Popen[str]:
    """bench/step_peak.py measuring one case (``--one ...``), on one rank or under torchrun."""
    launch, port = [sys.executable], free_port()
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}", f"--master_port={port}"]
    return subprocess.Popen(
        [*launch, str(SCRIPT), "--one", *case],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean_env(), "PYTHONPATH": str(ROOT), "MASTER_PORT": str(port)},
    )


def _found(proc: subprocess.Popen[str]) -> list[dict]:
    """Each rank's measured and planned bytes, as it printed them."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_the_planned_peak_is_within_10_percent_under_and_5_over_the_allocators():
    procs = [_start("tiny", "fp32", *case, "1") for case in CASES]
    for (stage, accum), proc in zip(CASES, procs, strict=True):
        [found] = _found(proc)
        ratio = found["planned"] / found["measured"]
        assert 0.9 < ratio < 1.05, (f"zero{stage} accum {accum}", found)


def test_a_pipelines_planned_peak_is_within_5_percent_of_its_fullest_ranks():
    found = _found(_start("tiny", "fp32", "0", "4", "2", ranks=2))
    assert len(found) == 2, found  # one line from each stage
    ratio = found[0]["planned"] / max(f["measured"] for f in found)
    assert 0.95 < ratio < 1.05, found


def test_a_large_tied_vocabularys_gradients_joining_are_planned():
    case = ("1", "1", "--micro=4", "--seq=64", "--set=model.vocab_size=32000")  # accum 1, pp 1
    procs = {stage: _start("tiny", "fp32", stage, *case) for stage in "12"}
    for stage, proc in procs.items():
        [found] = _found(proc)
        assert 0.97 < found["planned"] / found["measured"] < 1.03, (f"zero{stage}", found)


def test_a_16_bit_optimizer_steps_gradient_copies_are_planned():
    """Short sequences in bf16, where the optimizer step outgrows backward: ZeRO 1-2 write the
    gradient partition into fp32 in one pass, 20 B a parameter live. Measured 0.991 of the
    allocator's peak at both (0.819 and 0.815 before the plan counted the step); 10% under
    allowed, as above, for a stray tensor freed late (ZeRO-0's unfused wrapper, 20 B a
    parameter at its step: 0.996, 0.896 before, is too close to that bound to test here)."""
    case = ("1", "1", "--micro=1", "--seq=16")  # accum 1, pp 1
    procs = {stage: _start("tiny", "bf16", stage, *case) for stage in "12"}
    for stage, proc in procs.items():
        [found] = _found(proc)
        assert 0.9 < found["planned"] / found["measured"] < 1.05, (f"zero{stage}", found)
