"""ZeRO's step without its needless passes (runner/engine/lean_zero_step.py) moves the
weights as DeepSpeed's does.

One DeepSpeed rank on the CPU, in a child process (it starts torch.distributed), builds the
same small bf16 model twice per ZeRO stage, with DeepSpeed's step and with ladder's, clips
hard (clip 0.01, so every step is clipped) and compares the weights after three steps: a user
would see the same losses. AdamW's eps is large (0.1) so that the update depends on the
gradients' scale: a clip factor lost or applied twice would move the weights. The 16-bit
flat copy the step no longer makes is the plan's concern (tests/multirank/test_step_peak.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from train_helpers import ROOT, clean_env

from launchers.local import free_port

pytestmark = pytest.mark.multirank

STEPS = 3


def _child() -> None:
    """Each stage's largest weight difference after :data:`STEPS` steps, and what was removed."""
    import deepspeed
    import torch

    from runner.engine import lean_zero_step

    deepspeed.init_distributed(dist_backend="gloo")
    found = {}
    for stage in (1, 2, 3):
        weights, norms, removed = [], [], []
        for lean in (False, True):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 64))
            config = {
                "train_batch_size": 4,
                "bf16": {"enabled": True},
                "gradient_clipping": 0.01,
                "zero_optimization": {"stage": stage},
                "optimizer": {
                    "type": "AdamW",
                    "params": {"lr": 1e-2, "eps": 0.1, "torch_adam": True, "fused": True},
                },
            }
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            if lean:
                removed = lean_zero_step.install(engine)
            torch.manual_seed(1)
            for _ in range(STEPS):
                x = torch.randn(4, 64, dtype=torch.bfloat16)
                engine.backward(engine(x).float().pow(2).mean())
                engine.step()
            weights.append(torch.cat([m.detach().float().reshape(-1) for m in _masters(engine)]))
            norms.append(float(engine.get_global_grad_norm()))
        moved = float((weights[0] - weights[1]).abs().max())
        found[stage] = {
            "removed": removed,
            "max_diff": moved,
            "scale": float(weights[0].abs().max()),
            "norms": norms,
        }
    print(json.dumps(found))


def _masters(engine) -> list:
    wrapper = engine.optimizer
    if hasattr(wrapper, "fp32_partitioned_groups_flat"):
        return list(wrapper.fp32_partitioned_groups_flat)
    return list(wrapper.single_partition_of_fp32_groups)


@pytest.fixture(scope="module")
def stages() -> dict:
    port = free_port()
    env = {
        **clean_env(),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    done = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_lean_step_drops_its_three_copies_and_steps_the_same_weights(stages, stage):
    found = stages[stage]
    assert found["removed"] == ["one cast", "clip in kernel", "norm in chunks"], found
    # The fused kernel divides by the clip factor where DeepSpeed multiplies by its reciprocal:
    # the last bit of a gradient may differ, and Adam's update normalises it away.
    assert found["max_diff"] <= 1e-6 * max(1.0, found["scale"]), found
    deepspeeds, ladders = found["norms"]  # the gradient norm the run logs, from fp64 either way
    assert ladders == pytest.approx(deepspeeds, rel=1e-9)


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _child()
