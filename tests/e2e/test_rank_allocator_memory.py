"""A CPU rank on jemalloc holds its memory flat from step to step (runner/hardware/host_allocator.py).

The rank's allocator keeps every page it frees; were a step's small tensors not cut from those
kept pages, each step would take fresh ones and the rank would grow until the host ran out.
gpt2_124m's training step is the smallest workload here that showed it (66-75 MB a step with
jemalloc's default extent fit), so the test trains it for a few steps, as a rank's process:
the same environment the local launcher gives a CPU rank, ladder's model, torch's fused AdamW.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner.config import HostAllocator
from runner.hardware.host_allocator import jemalloc_installed, rank_allocator

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

STEPS = 8
# A gpt2_124m step (micro 2 x seq 128, two micro-batches), printing the rank's RSS after each.
TRAIN = textwrap.dedent(
    f"""
    import dataclasses, json, torch, yaml
    from runner.config import ModelConfig
    from runner.model.transformer import Transformer, lm_loss

    torch.manual_seed(0)
    preset = yaml.safe_load(open("conf/model/gpt2_124m.yaml"))
    known = {{f.name for f in dataclasses.fields(ModelConfig)}}
    cfg = ModelConfig(**{{k: v for k, v in preset.items() if k in known}})
    model = Transformer(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, cfg.vocab_size, (2, 128))
    rss = []
    for step in range({STEPS}):
        for micro in range(2):
            lm_loss(model(tokens), tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        status = open("/proc/self/status").read()
        rss.append(int(status.split("VmRSS:")[1].split()[0]) * 1024)
    print(json.dumps({{"rss": rss, "maps": "libjemalloc" in open("/proc/self/maps").read()}}))
    """
)


@pytest.mark.skipif(not jemalloc_installed(), reason="libjemalloc2 is not installed on this host")
def test_a_cpu_ranks_memory_stops_growing_after_its_first_steps():
    allocator = rank_allocator(HostAllocator.auto, cpu_rank=True, environ=os.environ)
    env = {**os.environ, **allocator.env, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", TRAIN], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["maps"], "the process did not run on jemalloc"
    rss = result["rss"]
    grown = rss[-1] - rss[2]
    # Before the fit was set, each step added 66-75 MB here: 350 MB over these 5 steps.
    assert grown < 20e6, f"RSS by step: {[round(r / 1e6) for r in rss]} MB: grew {grown / 1e6:.0f} MB"
