"""A layout change keeps the experiment: with the global batch fixed, the losses agree.

fp32 on CPU, 10 steps of the layout tests' experiment (tests/train_helpers.py
SMALL_EXPERIMENT: global batch 16, lr 1e-3): ZeRO stages 0-3 on 2 ranks (ZeRO-2 with
overlapped reduction in small buckets, and ZeRO-3 with every block compiled), and the same
batch as (1 rank, accum 4), (2 ranks, accum 2) and (2 ranks, micro doubled, accum 1); and
sequence parallelism on 2 ranks (each holds half of every sample) under ZeRO-1 and ZeRO-3,
whose gradient norms equal one rank's too (AdamW and the clip would hide a gradient twice
too large from the losses).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from train_helpers import (
    FP32_TOLERANCE,
    REFERENCE_STEPS,
    SMALL_EXPERIMENT,
    TrainResult,
    run_train,
    short_run,
    without,
)

pytestmark = pytest.mark.multirank

STEPS = REFERENCE_STEPS
# At lr 1e-3 the layouts agree within 1e-6 over these steps. At the default 3e-3 the tiny
# model passes a loss spike near step 10 that amplifies the fp32 rounding of the different
# reduction orders to 2e-4 for a few steps, then back to 3e-6 (measured, ddp 2x8 vs zero3
# 2x4, sequences of 128): the same experiment, a chaotic stretch of it.
#
# bf16 (2 ranks): a bf16 step takes about 10x an fp32 one on a CPU without native bf16, so
# the bf16 test compares the memory ledger's two bf16 runs (2 steps, sequences of 32),
# trained once per session: zero1 and zero3 agree within 8.6e-6 there. Measured over 10
# steps at sequences of 128: ZeRO stages 1-3 agree within 1.4e-4 over the first 7; step 7
# is a loss spike that amplifies the different bf16 rounding of each stage's reduction to
# 4.7e-3 (zero1/zero2), 3.1e-3 (zero1/zero3), 1.5e-3 (zero2/zero3); over the first 4,
# zero1 and zero3 within 8e-5. The bound holds outside such a spike with a 10x margin.
# Stage 0 in bf16 is another optimizer path in DeepSpeed (FP16_UnfusedOptimizer), which
# steps once at construction; ladder undoes that step (runner/engine/fixes/stage0_step_at_construction.py).
# Before, ddp drifted 9.8e-2 from the ZeRO stages over 10 steps (0.087 after one step:
# tiny, 1 rank, sequences of 64); after, 1.6e-4 from zero3 on 2 ranks over 8. zero2 in
# bf16 lies 5e-2 from fp32. bf16 layouts are the same experiment only to that precision;
# fp32 ones within FP32_TOLERANCE.
BF16_TOLERANCE = 1e-3

LAYOUTS = {
    "zero1/2x4": ["parallel=zero1", "gpus=2", "batch.micro_size=4"],
    "zero3/2x4": ["parallel=zero3", "gpus=2", "batch.micro_size=4"],
    # ZeRO-2 with overlapped reduction in small buckets: more, smaller collectives, the same sums.
    "zero2-overlap/2x4": [
        "parallel=zero2",
        "parallel.overlap_comm=true",
        "parallel.reduce_bucket_size=200000",
        "gpus=2",
        "batch.micro_size=4",
    ],
    # torch.compile'd blocks under ZeRO-3's gather/release hooks (measured: 2.4e-7 from eager).
    "zero3-compiled/2x4": ["parallel=zero3", "gpus=2", "batch.micro_size=4", "train.compile=true"],
    # DeepSpeed-Ulysses: dp 1, each rank half of every sample, attention's heads exchanged.
    "zero1-sp2/2x4": ["parallel=zero1", "parallel.sp=2", "gpus=2", "batch.micro_size=4"],
    "zero3-sp2/2x4": ["parallel=zero3", "parallel.sp=2", "gpus=2", "batch.micro_size=4"],
    "ddp/1x4": ["parallel=ddp", "gpus=1", "batch.micro_size=4"],
    "ddp/2x8": ["parallel=ddp", "gpus=2", "batch.micro_size=8"],
}
EXPERIMENT = [*without(SMALL_EXPERIMENT, "batch.micro_size"), f"train.steps={STEPS}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_rank_reference) -> dict[str, TrainResult]:
    """Every layout trained once for the module's tests; ddp/1x4 is the session's one-rank reference."""
    root: Path = tmp_path_factory.mktemp("layouts")
    results = {"ddp/1x4": one_rank_reference}
    for name, overrides in LAYOUTS.items():
        if name in results:
            continue
        result = run_train(*overrides, *EXPERIMENT, run_dir=root / name.replace("/", "_"))
        assert result.returncode == 0, (name, result.stderr[-3000:])
        results[name] = result
    return results


def _losses(result: TrainResult) -> list[float]:
    return [m["loss"] for m in result.metrics]


def test_accumulation_follows_the_layout(runs):
    accum = {name: r.summary["layout"]["accum_steps"] for name, r in runs.items()}
    assert accum == {
        "zero1/2x4": 2,
        "zero3/2x4": 2,
        "zero2-overlap/2x4": 2,
        "zero3-compiled/2x4": 2,
        "zero1-sp2/2x4": 4,
        "zero3-sp2/2x4": 4,
        "ddp/1x4": 4,
        "ddp/2x8": 1,
    }
    assert {r.summary["layout"]["global_size"] for r in runs.values()} == {16}


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(LAYOUTS, 2)))
def test_losses_agree_across_layouts(runs, a, b):
    losses_a, losses_b = _losses(runs[a]), _losses(runs[b])
    assert len(losses_a) == len(losses_b) == STEPS
    worst = max(abs(x - y) for x, y in zip(losses_a, losses_b, strict=True))
    assert worst <= FP32_TOLERANCE, f"{a} vs {b}: max |dloss| {worst:.2e}"


@pytest.mark.parametrize("layout", ["zero1-sp2/2x4", "zero3-sp2/2x4"])
def test_sequence_parallel_gradients_are_one_ranks(runs, layout):
    """The loss each rank backpropagates is its half's mean over sp, as DeepSpeed sums over the
    sequence group (runner/parallel/sequence.py): the gradient norm of every step is one rank's."""
    reference, split = runs["ddp/1x4"].metrics, runs[layout].metrics
    assert runs[layout].summary["layout"]["sp"] == 2 and runs[layout].summary["layout"]["dp"] == 1
    worst = max(abs(a["grad_norm"] / b["grad_norm"] - 1) for a, b in zip(reference, split, strict=True))
    print(f"{layout} vs 1 rank: max relative |d grad_norm| over {STEPS} steps = {worst:.2e}")
    assert worst <= FP32_TOLERANCE


def test_exposed_communication_is_measured_on_every_layout_of_two_ranks(runs):
    for name, result in runs.items():
        if result.summary["layout"]["dp"] > 1:
            assert all(m["time/comm_exposed_s"] > 0 for m in result.metrics), name
    zero_config = runs["zero2-overlap/2x4"].run_dir / "deepspeed_config.json"
    assert '"overlap_comm": true' in zero_config.read_text()


def test_a_compiled_run_says_so_and_measures_what_the_compiled_blocks_save(runs):
    compiled, eager = runs["zero3-compiled/2x4"].summary, runs["zero3/2x4"].summary
    assert compiled["compile"]["blocks"] == 4  # the tiny model's n_layer
    # ZeRO-3 gathers each linear layer's parameters in a hook torch cannot trace.
    assert compiled["compile"]["graph_breaks"] > 0
    assert compiled["compile"]["top_break_reasons"]
    assert eager.get("compile") is None
    # Inductor fuses the norms' and SwiGLU's elementwise chains, so autograd saves less.
    saved = {
        name: s["memory"]["measured"]["activations_gb"]
        for name, s in (("compiled", compiled), ("eager", eager))
    }
    assert 0 < saved["compiled"] < saved["eager"], saved
    # ZeRO-3 splits each compiled block at its gathers; the estimate counts what the split
    # graphs save (runner.memory.block_graph): measured to the byte.
    assert compiled["memory"]["rel_error"]["activations"] == pytest.approx(0, abs=0.01)


def test_training_moved(runs):
    losses = _losses(runs["ddp/2x8"])
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.parametrize(("a", "b"), [(("zero1", 2), ("zero3", 2)), (("ddp", 1), ("zero1", 2))])
def test_bf16_layouts_agree_within_the_measured_tolerance(trained_once, a, b):
    """The memory ledger's bf16 runs (train_helpers.SHORT_RUN): ZeRO-1 against ZeRO-3 on 2 ranks,
    and stage 0 on 1 rank against ZeRO-1 on 2 (DeepSpeed's step at construction undone)."""
    first, second = (trained_once(*short_run(parallel, gpus, "bf16")) for parallel, gpus in (a, b))
    worst = max(abs(x - y) for x, y in zip(_losses(first), _losses(second), strict=True))
    print(f"bf16 {a} vs {b}: max |dloss| over {len(_losses(first))} steps = {worst:.2e}")
    assert worst <= BF16_TOLERANCE


def test_sgd_under_zero_gives_the_plain_runs_losses(trained_once):
    """SGD is outside DeepSpeed's ZeRO optimizer list; ladder allows it there, since an elementwise
    step on a partition is the step on the whole. The memory ledger's ZeRO-3 SGD run (1 rank)
    against stage 0 on 1 rank and ZeRO-2 on 2, and no "untested optimizer" warning from DeepSpeed."""
    layouts = (("ddp", 1), ("zero3", 1), ("zero2", 2))
    plain, *zero = (trained_once(*short_run(parallel, gpus, "fp32", "sgd")) for parallel, gpus in layouts)
    for run in zero:
        worst = max(abs(x - y) for x, y in zip(_losses(plain), _losses(run), strict=True))
        assert worst <= FP32_TOLERANCE, (run.run_dir, _losses(plain), _losses(run))
        assert "untested optimizer" not in run.stdout + run.stderr
        assert (run.run_dir / "train.log").exists()
        assert "untested optimizer" not in (run.run_dir / "train.log").read_text()
