"""Which layout changes a resume takes, and the refusals, before any rank starts."""

from __future__ import annotations

import json

import pytest
from train_helpers import compose_config

from launchers.resume import _measured, finished_already
from runner.checkpoint import resume_rules as checkpoint
from runner.config import Precision
from runner.layout import resolve_layout
from runner.rundir import checkpoint_record

pytestmark = pytest.mark.unit


def _layout(gpus: int, tp: int = 1, pp: int = 1):
    return resolve_layout(gpus=gpus, tp=tp, pp=pp, global_size=16, micro_size=4)


def _record(zero_stage: int, gpus: int, tp: int = 1, pp: int = 1) -> dict:
    return {"tag": "step_00000004", "layout": _layout(gpus, tp, pp).to_json(), "zero_stage": zero_stage}


def test_stage0_at_tp1_pp1_moves_to_and_from_every_zero_stage_and_split():
    ddp = _record(0, gpus=2)
    for gpus, tp, pp, stage in ((1, 1, 1, 3), (2, 2, 1, 1), (2, 1, 2, 2), (4, 2, 2, 1)):
        layout = _layout(gpus, tp, pp)
        checkpoint.check_resumable(ddp, layout=layout, zero_stage=stage)
        assert checkpoint.resume_tag(ddp, layout=layout, zero_stage=stage) == checkpoint.universal_tag_for(
            ddp, layout
        )
        assert checkpoint.loads_universal(ddp, layout=layout, zero_stage=stage)
    tp_pp = {**_record(1, gpus=4, tp=2, pp=2), checkpoint_record.STAGE_SPLITS: True}
    for record in (_record(3, gpus=2), _record(1, gpus=4, tp=2), tp_pp):
        checkpoint.check_resumable(record, layout=_layout(1), zero_stage=0)
        assert checkpoint.resume_tag(record, layout=_layout(1), zero_stage=0) == "step_00000004_universal_ddp"
        # DeepSpeed loads the stage-0 file ladder wrote as the engine's own, not as a universal one.
        assert not checkpoint.loads_universal(record, layout=_layout(1), zero_stage=0)
    # Stage 0 onto stage 0 at its own tp and pp: DeepSpeed's own files, at any dp.
    assert checkpoint.resume_tag(ddp, layout=_layout(1), zero_stage=0) == "step_00000004"


def test_a_pipelines_stage0_checkpoint_moves_both_ways():
    """fp32: through stage-0 files ladder writes for each stage; bf16: DeepSpeed's BF16_Optimizer
    reads the universal checkpoint itself, and its state is cut over dp, so a new dp converts too."""
    pp2 = _record(0, gpus=2, pp=2)
    for gpus, tp, stage in ((1, 1, 0), (1, 1, 2), (2, 2, 1)):
        checkpoint.check_resumable(pp2, layout=_layout(gpus, tp), zero_stage=stage)
        assert checkpoint.needs_universal(pp2, layout=_layout(gpus, tp), zero_stage=stage)
    zero2 = _record(2, gpus=1)
    fp32, bf16 = Precision.fp32, Precision.bf16
    assert checkpoint.resume_tag(zero2, layout=_layout(2, pp=2), zero_stage=0, precision=fp32) == (
        "step_00000004_universal_ddp"
    )
    assert not checkpoint.loads_universal(zero2, layout=_layout(2, pp=2), zero_stage=0, precision=fp32)
    assert checkpoint.resume_tag(zero2, layout=_layout(2, pp=2), zero_stage=0, precision=bf16) == (
        "step_00000004_universal_pipeline"
    )
    assert checkpoint.loads_universal(zero2, layout=_layout(2, pp=2), zero_stage=0, precision=bf16)
    # Onto its own pp at another dp: fp32's optimizer is whole in each stage's file, bf16's cut over dp.
    for precision, converts in (("fp32", False), ("bf16", True)):
        record = {**pp2, "precision": precision}
        assert checkpoint.needs_universal(record, layout=_layout(4, pp=2), zero_stage=0) is converts
        assert not checkpoint.needs_universal(record, layout=_layout(2, pp=2), zero_stage=0)


def test_a_stage0_checkpoint_cut_by_tp_pp_or_both_moves_to_every_layout():
    """ladder joins stage 0's shards itself, so a tp x pp one needs no record of AutoTP's splits
    (a ZeRO one does: ds_to_universal joins by it)."""
    for record in (_record(0, gpus=2, tp=2), _record(0, gpus=2, pp=2), _record(0, gpus=4, tp=2, pp=2)):
        for layout, stage in ((_layout(2), 1), (_layout(1), 0), (_layout(4, tp=2, pp=2), 1)):
            checkpoint.check_resumable(record, layout=layout, zero_stage=stage)
    ddp_3d = _record(0, gpus=4, tp=2, pp=2)
    assert checkpoint.resume_tag(ddp_3d, layout=_layout(1), zero_stage=0) == "step_00000004_universal_ddp"
    checkpoint.check_resumable(ddp_3d, layout=_layout(8, tp=2, pp=2), zero_stage=0)  # any dp
    assert not checkpoint.needs_universal(ddp_3d, layout=_layout(8, tp=2, pp=2), zero_stage=0)
    zero1_3d = _record(1, gpus=4, tp=2, pp=2)  # written before ladder recorded every stage's splits
    with pytest.raises(ValueError, match=r"without the record of how every stage split its tensors"):
        checkpoint.check_resumable(zero1_3d, layout=_layout(1), zero_stage=0)


def test_an_sgd_checkpoint_resumes_on_its_own_layout_and_is_refused_a_move():
    zero1 = _record(1, gpus=2)
    checkpoint.check_resumable(zero1, layout=_layout(2), zero_stage=1, optimizer="sgd")  # no move
    with pytest.raises(ValueError) as refused:
        checkpoint.check_resumable(zero1, layout=_layout(1), zero_stage=1, optimizer="sgd")
    for words in ("carries Adam's state only (optimizer=sgd", "gpus=2 parallel.zero_stage=1"):
        assert words in str(refused.value)


def test_ddp_takes_another_layouts_checkpoint_at_any_tp_and_pp():
    zero1 = _record(1, gpus=2)
    for tp, pp in ((2, 1), (1, 2), (2, 2)):
        checkpoint.check_resumable(zero1, layout=_layout(tp * pp, tp=tp, pp=pp), zero_stage=0)
    # Under tensor parallelism the ranks slice the universal checkpoint themselves
    # (runner/checkpoint/stage0_tp.py), under a pipeline through its view of it.
    assert checkpoint.loads_universal(zero1, layout=_layout(2, tp=2), zero_stage=0)
    assert checkpoint.resume_tag(zero1, layout=_layout(2, tp=2), zero_stage=0) == "step_00000004_universal"
    assert checkpoint.loads_universal(zero1, layout=_layout(4, tp=2, pp=2), zero_stage=0)
    assert checkpoint.resume_tag(zero1, layout=_layout(4, tp=2, pp=2), zero_stage=0) == (
        "step_00000004_universal_pipeline"
    )


def _run_dir(tmp_path, *, status: str | None, steps_done: int | None, checkpoint_at: int | None):
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    if status is not None:
        (run_dir / "summary.json").write_text(json.dumps({"status": status, "steps_completed": steps_done}))
    if checkpoint_at is not None:
        tag = checkpoint_record.tag_for(checkpoint_at)
        (run_dir / "checkpoints" / tag).mkdir(parents=True)
        record = {"tag": tag, "completed_steps": checkpoint_at}
        (run_dir / "checkpoints" / "latest.json").write_text(json.dumps(record))
    return run_dir


def test_a_resumed_run_that_finished_its_steps_has_nothing_to_train(tmp_path):
    """A sweep's finished cell resumed with the rest, or a run resumed twice: nothing is launched,
    and the words say what a larger train.steps would do."""
    resumed = compose_config("train.resume=auto", "train.steps=4")
    done = _run_dir(tmp_path / "a", status="completed", steps_done=4, checkpoint_at=None)
    words = finished_already(resumed, done)
    assert words is not None and "completed 4 steps already (train.steps=4)" in words
    assert "trains it again from step 0" in words  # no checkpoint to continue from
    assert finished_already(compose_config("train.steps=4"), done) is None  # not a resume
    assert finished_already(compose_config("train.resume=auto", "train.steps=5"), done) is None
    # Its checkpoint at train.steps: finished, whatever its summary says (a rank killed after the save).
    saved = _run_dir(tmp_path / "b", status="running", steps_done=None, checkpoint_at=4)
    words = finished_already(resumed, saved)
    assert words is not None and "step_00000004 holds 4 steps" in words and "continues it from" in words
    stopped = _run_dir(tmp_path / "c", status="interrupted", steps_done=2, checkpoint_at=2)
    assert finished_already(resumed, stopped) is None


def test_a_conversion_is_measured_by_the_folders_it_writes_and_one_done_already_by_none(tmp_path):
    (tmp_path / "step_00000004").mkdir()
    (tmp_path / "latest.json").write_text("{}")

    def convert() -> None:
        folder = tmp_path / "step_00000004_universal"
        folder.mkdir(exist_ok=True)
        (folder / "zero.pt").write_bytes(b"x" * 1000)
        (tmp_path / "latest_universal").write_text("pointer")  # a file beside: not the copy

    measured = _measured(tmp_path, convert)
    assert measured is not None and measured["bytes"] == 1000 and measured["seconds"] >= 0
    assert _measured(tmp_path, convert) is None  # converted by an earlier attempt: nothing new
