"""The held-out loss is the experiment's, not the layout's: every layout evaluates the same sequences.

fp32 on CPU: 4 steps of the layout tests' experiment, evaluated after steps 2 and 4 on two
held-out global batches of the built-in text's held-out corpus (the standard library's test
suites), on one rank and on two under ZeRO-3 with whole blocks recomputed, a pipeline of two
stages, and tensor parallelism of two: within FP32_TOLERANCE (measured at the default lr 3e-3:
within 3e-7 of one another).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import FP32_TOLERANCE, SMALL_EXPERIMENT, run_train, without

pytestmark = pytest.mark.multirank

EVALUATED = [
    *without(SMALL_EXPERIMENT, "batch.micro_size"),
    "train.steps=4",
    "train.eval_every=2",
    "train.eval_batches=2",
]
LAYOUTS = {
    "ddp/1": ["parallel=ddp", "gpus=1"],
    "zero3-recompute/2": ["parallel=zero3", "gpus=2", "model.activation_checkpointing=full"],
    "pp2/2": ["parallel=pp2", "gpus=2"],
    "tp2/2": ["parallel=tp2", "gpus=2"],
}


def test_every_layout_measures_the_same_held_out_loss(tmp_path: Path):
    held_out: dict[str, dict[int, float]] = {}
    for name, layout in LAYOUTS.items():
        result = run_train(*layout, *EVALUATED, run_dir=tmp_path / name.replace("/", "_"))
        assert result.returncode == 0, (name, result.stderr[-3000:])
        held_out[name] = {m["step"]: m["eval/loss"] for m in result.metrics if "eval/loss" in m}
        evaluation = result.summary["eval"]
        assert evaluation["step"] == 4 and evaluation["loss"] == held_out[name][3]
        assert evaluation["sequences"] == 2 * 16 and "test suites" in evaluation["source"]
        wall = result.summary["wall_time"]
        assert wall["evaluations"] == 2 and wall["eval_s"] > 0
    reference = held_out.pop("ddp/1")
    assert sorted(reference) == [1, 3]  # after step 2 and after the last
    assert reference[3] < reference[1]  # it learns: the held-out text is Python too
    for name, losses in held_out.items():
        assert losses == pytest.approx(reference, abs=FP32_TOLERANCE), name
