"""A checkpoint's size by arithmetic, and the refusals of runs and sweeps whose checkpoints cannot fit."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from train_helpers import compose_config

from runner.checkpoint import size as checkpoint_size
from runner.checkpoint.size import (
    SAVED_FILE_RECORDS,
    Conversion,
    DiskNeed,
    checkpoint_bytes,
    config_checkpoint_bytes,
    saved_elements,
    universal_bytes,
)
from runner.model.shape import num_params, param_numels

pytestmark = pytest.mark.unit

Usage = namedtuple("Usage", "total used free")


def _llama_7b():
    return compose_config("model=llama_7b").model


@pytest.mark.parametrize(
    ("precision", "zero_stage", "per_param"),
    [
        ("fp32", 0, 4 + 8),  # the weights, Adam's m and v (the weights are the masters)
        ("fp32", 1, 4 + 12),  # ZeRO keeps an fp32 master partition of its own
        ("fp32", 3, 12),  # ZeRO-3 saves no weights beside its partitions
        ("bf16", 0, 2 + 12),  # FP16_UnfusedOptimizer's fp32 masters, m, v beside the bf16 module
        ("bf16", 2, 2 + 12),
        ("bf16", 3, 12),
        ("fp16", 1, 2 + 12),
    ],
)
def test_one_checkpoint_is_the_weights_and_the_fp32_optimizer_state(precision, zero_stage, per_param):
    model = _llama_7b()
    got = checkpoint_bytes(model, precision=precision, optimizer="adamw", zero_stage=zero_stage)
    assert got == per_param * num_params(model)


def test_bf16_at_stage_0_under_a_pipeline_saves_its_bf16_optimizers_state_twice():
    model = _llama_7b()
    got = checkpoint_bytes(model, precision="bf16", optimizer="adamw", zero_stage=0, pp=2)
    weights, with_state = saved_elements(model, tp=1, pp=2)
    assert got == 2 * weights + 2 * 12 * with_state
    fp16 = checkpoint_bytes(model, precision="fp16", optimizer="adamw", zero_stage=0, pp=2)
    assert fp16 == 2 * weights + 12 * with_state  # FP16_UnfusedOptimizer's: once


def test_sgd_saves_one_momentum_buffer_where_adam_saves_two():
    model = _llama_7b()
    adam = checkpoint_bytes(model, precision="bf16", optimizer="adamw", zero_stage=1)
    sgd = checkpoint_bytes(model, precision="bf16", optimizer="sgd", zero_stage=1)
    assert adam - sgd == 4 * num_params(model)


def test_tensor_parallel_saves_the_norms_on_each_rank_and_a_tied_pipeline_the_heads_state_twice():
    tiny = compose_config().model
    assert tiny.tie_embeddings
    norms = (2 * tiny.n_layer + 1) * tiny.d_model
    assert saved_elements(tiny, tp=1, pp=1) == (num_params(tiny), num_params(tiny))
    assert saved_elements(tiny, tp=2, pp=1) == (num_params(tiny) + norms,) * 2
    head = tiny.vocab_size * tiny.d_model
    assert saved_elements(tiny, tp=1, pp=2) == (num_params(tiny), num_params(tiny) + head)
    untied = compose_config("model.tie_embeddings=false").model
    assert saved_elements(untied, tp=1, pp=2) == (num_params(untied),) * 2


def _need(**changes) -> DiskNeed:
    fields = {"each": 10, "kept": 2, "saves": 5, "on_disk": 0, "free": 1000, "where": Path("/x")}
    return DiskNeed(**{**fields, **changes})


@pytest.mark.parametrize(
    ("kept", "saves", "on_disk", "to_write", "stays"),
    [
        (2, 5, 0, 3, 2),  # keeps 2, writes a third before it drops the oldest
        (2, 1, 0, 1, 1),  # one save in the run: one checkpoint
        (2, 2, 0, 2, 2),
        (1, 5, 0, 2, 1),
        (2, 5, 2, 1, 0),  # resumed beside its 2: one more at each save, then the oldest goes
        (1, 5, 3, 1, 0),  # fewer kept than there are: the first save prunes to 1
        (3, 5, 1, 3, 2),
    ],
)
def test_a_run_peaks_at_one_checkpoint_beyond_those_it_keeps(kept, saves, on_disk, to_write, stays):
    need = _need(kept=kept, saves=saves, on_disk=on_disk)
    assert need.to_write == to_write
    assert need.needed == 10 * to_write
    assert need.stays == 10 * stays


def test_a_run_whose_checkpoints_cannot_fit_is_refused_with_the_arithmetic_and_the_fixes(
    monkeypatch, tmp_path
):
    config = compose_config("train.checkpoint_every=10", "train.steps=100")
    each = config_checkpoint_bytes(config)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, int(2.5 * each)))
    need = checkpoint_size.disk_need(config, tmp_path / "not" / "made" / "yet")
    assert need.where == tmp_path  # the nearest folder that exists: where the files land
    problem = checkpoint_size.disk_problem(need, config)
    assert problem is not None
    for words in (
        "train.checkpoint_every=10",
        f"3 x {each / 1e9:.3f} GB",
        "train.keep_checkpoints=2, and one written before the oldest goes",
        f"{2.5 * each / 1e9:.3f} GB free on the filesystem of {tmp_path}",
        "train.keep_checkpoints=1 needs",  # 2 of them fit
        "hydra.run.dir=",
        "train.checkpoint_every=0",
    ):
        assert words in problem, words
    # Without periodic checkpoints only the stop's one is at stake: a warning, not a refusal.
    quiet = compose_config("train.steps=100")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, each // 2))
    need = checkpoint_size.disk_need(quiet, tmp_path)
    assert checkpoint_size.disk_problem(need, quiet) is None
    warning = checkpoint_size.stop_save_warning(need, quiet)
    assert warning is not None and "a stopped run could not be continued" in warning


def test_a_run_that_saves_less_often_than_it_keeps_needs_only_its_saves(monkeypatch, tmp_path):
    config = compose_config("train.checkpoint_every=60", "train.steps=100", "train.keep_checkpoints=5")
    each = config_checkpoint_bytes(config)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, int(1.5 * each)))
    need = checkpoint_size.disk_need(config, tmp_path)
    assert need.saves == 1 and need.fits
    resumed = checkpoint_size.disk_need(config, tmp_path, done_steps=90)
    assert resumed.saves == 1  # no periodic save left: the one a stop would write


def test_the_record_says_what_its_saves_count_and_none_reads_as_checkpoints_written(monkeypatch, tmp_path):
    """``saves: 1`` beside ``checkpoints: 0`` read as a contradiction: the record names both counts."""
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, 10**12))
    never = checkpoint_size.disk_need(compose_config("train.checkpoint_every=0"), tmp_path).to_json()
    assert (never["saves"], never["saves_weighed"], never["periodic_saves"]) == (1, 1, 0)
    assert never["stop_save_weighed"] is True
    config = compose_config("train.checkpoint_every=10", "train.steps=100")
    every = checkpoint_size.disk_need(config, tmp_path).to_json()
    assert (every["saves_weighed"], every["periodic_saves"], every["stop_save_weighed"]) == (10, 10, False)


def test_the_checkpoint_after_the_last_step_is_weighed_and_a_run_it_cannot_fit_is_refused(
    monkeypatch, tmp_path
):
    """train.save_final (the default; the suite sets it off): one more save where no periodic one
    falls on the last step, weighed as the periodic ones are and refused alike when it cannot fit."""
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, 10**12))
    final = checkpoint_size.disk_need(compose_config("train.save_final=true"), tmp_path).to_json()
    assert (final["saves_weighed"], final["final_save"], final["stop_save_weighed"]) == (1, True, False)
    ten = compose_config("train.save_final=true", "train.checkpoint_every=4", "train.steps=10")
    assert (
        checkpoint_size.disk_need(ten, tmp_path).saves,
        checkpoint_size.disk_need(ten, tmp_path).final_save,
    ) == (3, True)
    eight = compose_config("train.save_final=true", "train.checkpoint_every=4", "train.steps=8")
    assert checkpoint_size.disk_need(eight, tmp_path).saves == 2  # the last periodic save is the final one
    config = compose_config("train.save_final=true")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, config_checkpoint_bytes(config) // 2))
    refusal = checkpoint_size.disk_problem(checkpoint_size.disk_need(config, tmp_path), config)
    assert refusal is not None and refusal.startswith("train.save_final=true: the run's checkpoints need 1 x")
    assert "with train.checkpoint_every=0 train.save_final=false it saves only when stopped" in refusal
    stop_only = compose_config("train.save_final=false")
    assert checkpoint_size.disk_problem(checkpoint_size.disk_need(stop_only, tmp_path), stop_only) is None


def test_a_sweep_needs_what_its_cells_keep_one_after_another_or_all_at_once(monkeypatch, tmp_path):
    cells = [
        compose_config("train.checkpoint_every=10", "train.steps=100", f"parallel={p}")
        for p in ("ddp", "zero1")
    ]
    ddp, zero1 = (config_checkpoint_bytes(c) for c in cells)
    in_turn = 2 * ddp + 2 * zero1 + zero1  # what each keeps, and one more at the fullest save
    at_once = 3 * ddp + 3 * zero1
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, in_turn))
    assert checkpoint_size.sweep_disk_problem(cells, tmp_path) is None
    problem = checkpoint_size.sweep_disk_problem(cells, tmp_path, at_once=True)
    assert problem is not None and f"need {at_once / 1e9:.3f} GB" in problem and "hydra.sweep.dir" in problem
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, in_turn - 1))
    problem = checkpoint_size.sweep_disk_problem(cells, tmp_path)
    assert problem is not None and f"need {in_turn / 1e9:.3f} GB" in problem
    assert checkpoint_size.sweep_disk_problem(cells[:1], tmp_path) is None  # one cell: its own check


def test_a_universal_copy_is_every_parameter_in_fp32_with_its_state_beside_the_model_states():
    tiny = compose_config().model
    params, tied = num_params(tiny), tiny.vocab_size * tiny.d_model  # tiny ties its embeddings
    files = len(param_numels(tiny)) * 4 + 1  # fp32, m, v, step a tensor; the tied one's fp32
    # fp32 weight, m, v; the tied weight's second name in fp32; each file's zip records.
    whole = params * 12 + tied * 4 + files * SAVED_FILE_RECORDS

    def universal(zero_stage, precision="fp32", **split):
        return universal_bytes(tiny, optimizer="adamw", zero_stage=zero_stage, precision=precision, **split)

    # ZeRO-3 saves no weights; ds_to_universal's fragments take the same room again until merged,
    # beside rank 0's optimizer file (its fp32 partition and moments, trimmed after).
    fragments = params * 12
    assert universal(3, dp=2) == (whole, whole + fragments + params // 2 * 12)
    # ZeRO 1-2 copy the model-states file's weights; in fp32 a tied weight's second name is
    # written with that file's whole storage until trimmed.
    assert universal(1) == (whole + params * 4, whole + fragments + params * 4)
    assert universal(2, "bf16") == (whole + params * 2, whole + fragments)
    assert universal(1, pp=2)[0] == whole  # a pipeline's weights are in its layer files, not copied
    # ladder's own conversion of stage 0: rank 0's model-states file, no temporary fragments.
    norms = (2 * tiny.n_layer + 1) * tiny.d_model
    assert universal(0, tp=2) == (whole + (params + norms) // 2 * 4,) * 2
    sgd = universal_bytes(tiny, optimizer="sgd", zero_stage=3, precision="fp32")
    assert sgd[0] == params * 8 + tied * 4 + (len(param_numels(tiny)) * 3 + 1) * SAVED_FILE_RECORDS


def test_a_move_needs_its_conversion_beside_the_checkpoints_it_will_write(tmp_path):
    conversion = Conversion(tag="step_00000004", stays=25, peak=40, own_layout="gpus=2 parallel.zero_stage=1")
    need = _need(kept=1, saves=5, conversion=conversion)
    assert need.needed == max(40, 25 + 2 * 10)  # the copies stay until their checkpoint is pruned
    assert "+ 0.000 GB of step_00000004 converted for this layout" in need.arithmetic()
    assert need.to_json()["conversion"] == {"tag": "step_00000004", "bytes": 25, "peak_bytes": 40}
    assert need.conversion_problem() is None
    config = compose_config("train.checkpoint_every=0")
    cramped = _need(free=39, conversion=conversion)
    problem = checkpoint_size.disk_problem(cramped, config)  # refused even without periodic saves
    assert problem is not None
    for words in (
        "train.resume=auto: moving step_00000004 to this layout writes a converted copy beside it",
        "free on the filesystem of /x",
        "own layout (gpus=2 parallel.zero_stage=1), which needs no copy",
    ):
        assert words in problem, words
