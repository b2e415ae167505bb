"""The batch contract: global = micro x accum x dp, dp = gpus / (tp x pp)."""

import pytest

from runner.layout import LayoutError, parse_micro_size, resolve_layout, workable_gpus

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("gpus", "tp", "pp", "global_size", "micro", "dp", "accum"),
    [
        (1, 1, 1, 16, 4, 1, 4),
        (2, 1, 1, 16, 4, 2, 2),
        (2, 1, 1, 16, 8, 2, 1),
        (8, 1, 1, 256, 4, 8, 8),
        (64, 1, 1, 1024, 2, 64, 8),
        (16, 2, 2, 64, 4, 4, 4),
        (8, 8, 1, 32, 1, 1, 32),
    ],
)
def test_accum_is_derived(gpus, tp, pp, global_size, micro, dp, accum):
    layout = resolve_layout(gpus=gpus, tp=tp, pp=pp, global_size=global_size, micro_size=micro)
    assert (layout.dp, layout.accum_steps) == (dp, accum)
    assert layout.micro_size * layout.accum_steps * layout.dp == layout.global_size


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(gpus=2, global_size=16, micro_size=3), ["batch.micro_size=3", "16", "x dp 2", "{1, 2, 4, 8}"]),
        (dict(gpus=3, global_size=16, micro_size=4), ["dp=3", "gpus in {1, 2, 4, 8, 16}"]),
        (dict(gpus=0, global_size=16, micro_size=4), ["gpus=0", "at least 1"]),
        (dict(gpus=4, global_size=16, micro_size=8), ["micro 8 x accum 0.5 x dp 4", "gpus in {1, 2}"]),
        (dict(gpus=1, global_size=0, micro_size=1), ["batch.global_size=0"]),
        (dict(gpus=1, global_size=8, micro_size=0), ["batch.micro_size=0"]),
    ],
)
def test_impossible_layouts_explain_the_arithmetic(kwargs, expected):
    with pytest.raises(LayoutError) as info:
        resolve_layout(tp=1, pp=1, **kwargs)
    for fragment in expected:
        assert fragment in str(info.value)


def test_gpus_must_be_a_multiple_of_model_parallel_degrees():
    with pytest.raises(LayoutError, match=r"tp x pp = 2 x 2 = 4.*\{4, 8, 12, 16\}"):
        resolve_layout(gpus=6, tp=2, pp=2, global_size=16, micro_size=1)


def test_auto_takes_the_largest_micro_that_fits():
    layout = resolve_layout(gpus=2, tp=1, pp=1, global_size=32, micro_size=None, fits=lambda m: m <= 5)
    assert (layout.micro_size, layout.accum_steps) == (4, 4)
    assert resolve_layout(gpus=2, tp=1, pp=1, global_size=32, micro_size=None).micro_size == 16


def test_auto_leaves_two_gradients_per_step_on_one_rank():
    # The noise scale needs two gradients per step: on one rank, auto stops below global.
    layout = resolve_layout(gpus=1, tp=1, pp=1, global_size=16, micro_size=None)
    assert (layout.micro_size, layout.accum_steps) == (8, 2)
    assert resolve_layout(gpus=1, tp=1, pp=1, global_size=1, micro_size=None).micro_size == 1
    assert resolve_layout(gpus=1, tp=1, pp=1, global_size=16, micro_size=16).accum_steps == 1


def test_auto_keeps_four_micro_batches_per_stage_under_a_pipeline():
    # 1F1B's bubble is (pp - 1) / accum of the ideal step: auto keeps accum >= 4 pp.
    layout = resolve_layout(gpus=2, tp=1, pp=2, global_size=16, micro_size=None)
    assert (layout.micro_size, layout.accum_steps) == (2, 8)
    layout = resolve_layout(gpus=64, tp=8, pp=4, global_size=64, micro_size=None)  # dp 2, 32 per rank
    assert (layout.micro_size, layout.accum_steps) == (2, 16)
    # Fewer sequences than 4 pp: as many micro-batches as there are sequences.
    assert resolve_layout(gpus=8, tp=1, pp=8, global_size=16, micro_size=None).micro_size == 1
    # Memory still decides below that bound, and a configured micro is kept.
    assert (
        resolve_layout(gpus=2, tp=1, pp=2, global_size=64, micro_size=None, fits=lambda m: m < 4).micro_size
        == 2
    )
    assert resolve_layout(gpus=2, tp=1, pp=2, global_size=16, micro_size=8).accum_steps == 2


def test_auto_with_nothing_that_fits_says_what_to_do():
    with pytest.raises(LayoutError, match="plan=true"):
        resolve_layout(gpus=1, tp=1, pp=1, global_size=8, micro_size=None, fits=lambda m: False)


def test_parse_micro_size():
    assert parse_micro_size("auto") is None
    assert parse_micro_size("4") == 4
    with pytest.raises(LayoutError, match="positive integer or 'auto'"):
        parse_micro_size("four")


def test_workable_gpus_are_near_the_request():
    values = workable_gpus(global_size=256, tp=1, pp=1, near=48)
    assert 32 in values and 64 in values and all(256 % g == 0 for g in values)


def test_sequence_parallel_ranks_share_each_sample_and_leave_dp_the_rest():
    layout = resolve_layout(gpus=8, tp=1, pp=1, sp=4, global_size=16, micro_size=2)
    assert (layout.dp, layout.accum_steps, layout.zero_ranks, layout.model_parallel) == (2, 4, 8, 4)
    assert layout.split_words() == "gpus 8 = dp 2 x tp 1 x pp 1 x sp 4; global 16 = micro 2 x accum 4 x dp 2"
    assert layout.to_json()["sp"] == 4


def test_gpus_that_sequence_parallelism_does_not_divide_are_refused_with_workable_counts():
    with pytest.raises(LayoutError, match=r"tp x pp x sp = 1 x 1 x 4 = 4.*try gpus in \{4, 8, 12, 16\}"):
        resolve_layout(gpus=6, tp=1, pp=1, sp=4, global_size=16, micro_size=1)
    with pytest.raises(LayoutError, match=r"\(gpus 8 / \(tp 1 x pp 1 x sp 2\)\): 6 / 4 is not whole"):
        resolve_layout(gpus=8, tp=1, pp=1, sp=2, global_size=6, micro_size=1)
