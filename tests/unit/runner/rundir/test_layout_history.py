"""summary.json's layout_history: the layouts a run trained on, from the step each began."""

from __future__ import annotations

import pytest

from runner.layout import resolve_layout
from runner.rundir.layout_history import describe, extended, segment

pytestmark = pytest.mark.unit


def _segment(from_step: int, parallel: str, gpus: int, tp: int = 1) -> dict:
    layout = resolve_layout(gpus=gpus, tp=tp, pp=1, global_size=16, micro_size=4)
    return segment(from_step=from_step, parallel=parallel, zero_stage=0, precision="fp32", layout=layout)


def test_a_resume_keeps_the_segments_before_its_checkpoint_and_adds_its_own():
    first = _segment(0, "ddp", 2)
    assert extended(None, None, first) == [first]  # a fresh start
    second = _segment(4, "zero3", 4, tp=2)
    record = {"completed_steps": 4, "zero_stage": 0, "layout": {}}
    history = extended([first], record, second)
    assert history == [first, second]
    # Resumed again from step 4 (the zero3 attempt failed before its next checkpoint): replaced.
    third = _segment(4, "zero1", 1)
    assert extended(history, record, third) == [first, third]
    assert describe(history) == (
        "layouts: ddp on 2 (dp 2) from step 0 -> zero3 on 4 (dp 2 x tp 2) from step 4"
    )
    assert describe([first]) is None  # one layout: nothing to say


def test_a_run_from_before_the_history_gets_its_first_segment_from_the_checkpoint():
    saved = resolve_layout(gpus=2, tp=1, pp=1, global_size=16, micro_size=4)
    record = {"completed_steps": 6, "zero_stage": 2, "layout": saved.to_json()}
    history = extended(None, record, _segment(6, "ddp", 1))
    assert [seg["from_step"] for seg in history] == [0, 6]
    assert describe(history).startswith("layouts: zero_stage 2 on 2 (dp 2) from step 0 -> ddp on 1")


def test_a_run_resumed_in_the_layout_it_stopped_in_keeps_one_segment():
    """Stopped at Ctrl-C or requeued by SLURM, then resumed as it was: no layout change to report."""
    first = _segment(0, "ddp", 2)
    record = {"completed_steps": 11, "zero_stage": 0, "layout": {}}
    assert extended([first], record, _segment(11, "ddp", 2)) == [first]
    assert describe(extended([first], record, _segment(11, "ddp", 2))) is None
    moved = extended([first], record, _segment(11, "ddp", 1))
    assert [seg["from_step"] for seg in moved] == [0, 11]


def test_a_segment_reached_by_a_conversion_says_how_long_it_took_and_what_it_wrote():
    first = _segment(0, "zero1", 2)
    layout = resolve_layout(gpus=1, tp=1, pp=1, global_size=16, micro_size=4)
    converted = {"seconds": 4.25, "bytes": 52_200_000}
    moved = segment(
        from_step=4, parallel="zero2", zero_stage=2, precision="fp32", layout=layout, conversion=converted
    )
    record = {"completed_steps": 4, "zero_stage": 1, "layout": {}}
    history = extended([first], record, moved)
    assert history[-1]["conversion"] == converted
    assert describe(history) == (
        "layouts: zero1 on 2 (dp 2) from step 0 -> "
        "zero2 on 1 (dp 1) from step 4 (converted in 4.2 s, 52.2 MB)"
    )
    # Stopped, then resumed on the layout it had moved to: the same segment, its conversion kept.
    again = segment(from_step=6, parallel="zero2", zero_stage=2, precision="fp32", layout=layout)
    assert extended(history, {"completed_steps": 6, "zero_stage": 2, "layout": {}}, again) == history


def test_a_sequence_parallel_segment_says_so_and_an_earlier_segment_without_sp_is_sp_1():
    from runner.layout import Layout
    from runner.rundir.layout_history import describe, extended, segment

    split = Layout(gpus=2, dp=1, tp=1, pp=1, micro_size=4, accum_steps=4, global_size=16, sp=2)
    first = segment(from_step=0, parallel="zero1", zero_stage=1, precision="fp32", layout=split)
    whole = Layout(gpus=1, dp=1, tp=1, pp=1, micro_size=4, accum_steps=4, global_size=16)
    second = segment(from_step=3, parallel="ddp", zero_stage=0, precision="fp32", layout=whole)
    said = "layouts: zero1 on 2 (dp 1 x sp 2) from step 0 -> ddp on 1 (dp 1) from step 3"
    assert describe([first, second]) == said
    # summary.json from before sequence parallelism: the same layout resumed adds no segment
    earlier = {key: value for key, value in second.items() if key != "sp"}
    record = {"zero_stage": 0, "layout": whole.to_json()}
    assert extended([earlier], record, {**second, "from_step": 5}) == [earlier]  # type: ignore[arg-type]
