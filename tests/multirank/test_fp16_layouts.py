"""fp16 keeps the experiment across layouts: stage 0 scales its loss, clips by the whole model.

DeepSpeed's fp16 paths on a CPU: tests/cpu_answers tells its CPU accelerator that this CPU
has fp16 kernels (torch computes fp16 on any CPU, more slowly), nothing else changed. tiny
at half its width (d_model 128), global batch 16 as micro 4, sequences of 16, lr 1e-3, 7
steps; dynamic loss scale from 2^16, so step 0 overflows and is skipped on every layout
alike, and a window of 3 steps, so the scale doubles back after step 4 on every layout
alike. Measured against `ddp` on one rank: ZeRO-1 and `ddp` on 2 ranks, at tp 2, pp 2 and
tp 2 x pp 2 within 1.2e-5 to 2.5e-5 in loss, and in gradient norm within the 1e-3 (relative)
the tests allow.
Before ladder's fixes (runner/engine/fixes/fp16_stage0_loss_scale.py,
runner/engine/fixes/unfused_clip_norm.py, the fp16 section
of runner/engine/deepspeed_config.py), measured at full width on sequences of 32: `ddp` trained
unscaled and unclipped (the same losses with `optimizer.grad_clip=0`; 0.29 below ZeRO-1 at
step 2), `ddp` at pp 2 clipped by 18.97 where the model's norm is 17.96, and `ddp` on 2
ranks overflowed once more than one rank, skipping a step the others took.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from train_helpers import TrainResult, cpu_answers_env, run_on_any_gpus, run_train

pytestmark = pytest.mark.multirank

STEPS = 7
UNWINDOWED = (
    "precision=fp16",
    "batch.global_size=16",
    "batch.micro_size=4",
    "data.seq_len=16",
    "optimizer.lr=1e-3",
    "logger=none",
    # tiny at half its width: fp16 on a CPU without fp16 kernels is slow.
    "model.d_model=128",
    "model.ffn_hidden=344",
)
EXPERIMENT = (*UNWINDOWED, "precision.loss_scale_window=3")
FP16 = (*EXPERIMENT, f"train.steps={STEPS}")
# 2^16 overflows at step 0 and is halved; 3 steps without an overflow double it back.
SCALES = [2.0**16] + [2.0**15] * 4 + [2.0**16] * 2
LAYOUTS = {
    "ddp on 1": ("parallel=ddp", "gpus=1"),
    "zero1 on 2": ("parallel=zero1", "gpus=2"),
    "ddp on 2": ("parallel=ddp", "gpus=2"),
    "ddp at tp 2": ("parallel=ddp", "gpus=2", "parallel.tp=2"),
    "ddp at pp 2": ("parallel=ddp", "gpus=2", "parallel.pp=2"),
    "ddp at tp 2 x pp 2": ("parallel=ddp", "gpus=4", "parallel.tp=2", "parallel.pp=2"),  # by torchrun
}
# fp16's 10-bit mantissa: the layouts' different summation orders (and at tp 2 the split
# matrices' own) put them up to 2.5e-5 apart here (1.0e-4 at full width, sequences of 32).
FP16_TOLERANCE = 5e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, TrainResult]:
    root: Path = tmp_path_factory.mktemp("fp16")
    results = {}
    for index, (name, layout) in enumerate(LAYOUTS.items()):
        result = run_on_any_gpus(*layout, *FP16, run_dir=root / f"run{index}", env=cpu_answers_env())
        assert result.returncode == 0, (name, result.stderr[-3000:])
        results[name] = result
    return results


def _norms(result: TrainResult) -> list[float]:
    return [float(m["grad_norm"]) for m in result.metrics]


def _scales(result: TrainResult) -> list[float]:
    return [m["train/loss_scale"] for m in result.metrics]


def test_every_layout_skips_the_same_overflowing_steps(runs):
    skipped = {name: [not math.isfinite(n) for n in _norms(result)] for name, result in runs.items()}
    print(f"overflowing steps (skipped): {skipped}")
    assert skipped["ddp on 1"] == [True] + [False] * (STEPS - 1)  # 2^16 overflows once, then halved
    assert all(flags == skipped["ddp on 1"] for flags in skipped.values()), skipped
    for result in runs.values():  # summary.json says which, and the scale reached
        assert result.summary["fp16_loss_scale"] == {"final_scale": 2.0**16, "overflow_steps": [0]}


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != "ddp on 1"])
def test_each_layout_trains_one_ranks_experiment(runs, layout):
    plain, other = runs["ddp on 1"].metrics, runs[layout].metrics
    assert len(plain) == len(other) == STEPS
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(plain, other, strict=True))
    print(f"fp16, {layout} vs ddp on 1: max |dloss| over {STEPS} steps = {worst:.2e}")
    assert worst <= FP16_TOLERANCE
    for a, b in zip(_norms(runs["ddp on 1"]), _norms(runs[layout]), strict=True):
        if math.isfinite(a):  # the reported norm is the gradients' own, not the loss-scaled one
            assert b == pytest.approx(a, rel=1e-3)
    assert plain[-1]["loss"] < plain[1]["loss"] - 0.5  # it trains


def test_the_loss_scale_is_logged_and_grows_at_the_same_step_on_every_layout(runs):
    scales = {name: _scales(result) for name, result in runs.items()}
    assert scales["ddp on 1"] == SCALES
    assert all(values == SCALES for values in scales.values()), scales


def test_the_noise_scale_is_measured_past_the_overflow(runs):
    """An overflowing step's infinite norm is left out of the noise scale's EMAs (it poisoned them)."""
    plain = runs["ddp on 1"].summary["noise_scale"]
    assert plain["simple"] is not None and plain["simple"] > 0, plain
    assert plain["updates"] == STEPS - 1  # every step but the skipped one
    for name in ("zero1 on 2", "ddp on 2", "ddp at tp 2"):
        other = runs[name].summary["noise_scale"]["simple"]
        print(f"noise scale B_simple: {name} {other:.5f}, ddp on 1 {plain['simple']:.5f}")
        assert other == pytest.approx(plain["simple"], rel=1e-3)


def test_a_run_moves_across_layouts_with_its_loss_scale(runs, tmp_path):
    """ddp on 1 -> ZeRO-1 on 2 -> ddp at pp 2 -> ddp at tp 2 x pp 2, one step each, then ddp on 1
    to the end: the uninterrupted losses, and the loss scale goes on where it was (the universal
    checkpoint holds none: without ladder's record it was 2^16 again after each move), doubling
    after step 4 as in one run: the count of steps since the overflow crossed three moves, and
    the window is the run's (the stage-0 file ladder writes from the universal one holds
    DeepSpeed's 1000)."""
    run_dir = tmp_path / "run"
    legs = {
        1: ("parallel=ddp", "gpus=1"),
        2: ("parallel=zero1", "gpus=2"),
        3: ("parallel=ddp", "gpus=2", "parallel.pp=2"),
        4: ("parallel=ddp", "gpus=4", "parallel.tp=2", "parallel.pp=2"),
        STEPS: ("parallel=ddp", "gpus=1"),
    }
    for last_step, leg in legs.items():
        steps = (f"train.steps={last_step}", f"train.checkpoint_every={last_step}")
        resume = ("train.resume=auto",) if last_step > 1 else ()
        result = run_on_any_gpus(*leg, *EXPERIMENT, *steps, *resume, run_dir=run_dir, env=cpu_answers_env())
        assert result.returncode == 0, (leg, result.stderr[-3000:])
    plain = runs["ddp on 1"].metrics
    moved = result.metrics
    assert [m["step"] for m in moved] == list(range(STEPS))
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(plain, moved, strict=True))
    print(f"fp16 across 5 layouts vs ddp on 1 uninterrupted: max |dloss| = {worst:.2e}")
    assert worst <= FP16_TOLERANCE
    assert _scales(result) == SCALES
    assert result.summary["fp16_loss_scale"]["overflow_steps"] == [0]  # step 0 was the first leg's


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_memory_ledger_counts_fp16s_terms(runs, layout):
    """Measured after the first step that updated (step 0 overflowed, so Adam's state is made at
    step 1): each term as estimated. At step 1 ZeRO's optimizer term read 1/3 of it (the fp32
    masters, no moments yet)."""
    memory = runs[layout].summary["memory"]
    assert "step 2 accumulation boundary" in memory["measured_at"]
    for term in ("params", "grads", "optimizer", "activations"):
        error = memory["rel_error"][term]
        assert error is not None and abs(error) <= 0.02, (term, memory)


# Unclipped (clipping would rescale the gradients and hide a wrong unscaling): the scale
# doubling after step 4 as above, or never (the default window of 1000 steps).
UNCLIPPED = ("optimizer.grad_clip=0", f"train.steps={STEPS}")


@pytest.fixture(scope="module")
def growth_runs(tmp_path_factory) -> dict[str, TrainResult]:
    root: Path = tmp_path_factory.mktemp("fp16_growth")
    runs = {}
    cases = {
        "never grows": ("parallel=ddp", "gpus=1", *UNWINDOWED, *UNCLIPPED),
        "ddp on 1": ("parallel=ddp", "gpus=1", *EXPERIMENT, *UNCLIPPED),
        "zero1 on 2": ("parallel=zero1", "gpus=2", *EXPERIMENT, *UNCLIPPED),
    }
    for name, overrides in cases.items():
        result = run_train(*overrides, run_dir=root / name, env=cpu_answers_env())
        assert result.returncode == 0, (name, result.stderr[-3000:])
        runs[name] = result
    return runs


def test_the_loss_scale_grows_after_the_step_that_earned_it(growth_runs):
    """The step that doubles the scale unscales its gradients by the scale they were made with:
    the losses of a run whose scale never grows (DeepSpeed unscaled by the new one, half the
    gradient: 7.0e-3 from it at step 6, measured with ladder's fix taken out)."""
    grows, never = growth_runs["ddp on 1"], growth_runs["never grows"]
    assert _scales(grows) == SCALES
    assert _scales(never) == [2.0**16] + [2.0**15] * (STEPS - 1)
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(grows.metrics, never.metrics, strict=True))
    print(f"fp16, scale doubled at step 4 vs never: max |dloss| = {worst:.2e}")
    assert worst <= 1e-5


def test_zero1_unscales_the_growing_step_as_one_rank_does(growth_runs):
    """ZeRO-1's own fp16 optimizer, unclipped, through the same doubling."""
    plain, other = growth_runs["ddp on 1"], growth_runs["zero1 on 2"]
    assert _scales(other) == _scales(plain)
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(plain.metrics, other.metrics, strict=True))
    print(f"fp16, scale growing, unclipped, zero1 on 2 vs ddp on 1: max |dloss| = {worst:.2e}")
    assert worst <= FP16_TOLERANCE
