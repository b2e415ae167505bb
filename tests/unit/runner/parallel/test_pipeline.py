"""The pipeline's stage split and its per-stage accounting (runner/parallel/pipeline_split.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runner.checkpoint import resume_rules as checkpoint
from runner.config import ModelConfig
from runner.layout import resolve_layout
from runner.memory import TRANSIENT_ITEMS, BlockShape, activation_items_total
from runner.memory_model.boundary import stage_activations
from runner.model.shape import layer_param_numels
from runner.model.transformer import num_params
from runner.parallel.pipeline_split import (
    rank_param_numels,
    stage_blocks,
    stage_bounds,
    stage_param_numels,
)
from runner.rundir import checkpoint_record

pytestmark = pytest.mark.unit

TINY = ModelConfig(n_layer=4, n_head=4, d_model=256, ffn_hidden=688, vocab_size=256, tie_embeddings=True)


@pytest.mark.parametrize(
    ("n_layer", "pp", "blocks"),
    [(4, 2, [2, 2]), (5, 2, [3, 2]), (4, 4, [1, 1, 1, 1]), (8, 3, [3, 3, 2]), (3, 1, [3])],
)
def test_blocks_are_balanced_over_stages(n_layer, pp, blocks):
    assert stage_blocks(n_layer, pp) == blocks


def test_the_split_is_deepspeeds_balanced_partition():
    """DeepSpeed's ``type:BlockPipe`` split, counted without torch: every depth to 40, and deep models."""
    from deepspeed.runtime.utils import partition_balanced

    cases = [(n, pp) for n in range(1, 41) for pp in range(1, min(n, 8) + 1)]
    cases += [(n, pp) for n in (48, 80, 126) for pp in (2, 3, 4, 8)]
    for n_layer, pp in cases:
        theirs = [int(p) for p in partition_balanced(weights=[0] + [1] * n_layer + [0, 0], num_parts=pp)]
        ours = [start for start, _ in stage_bounds(n_layer, pp)] + [n_layer + 3]
        assert ours == theirs, (n_layer, pp)


def test_embedding_on_the_first_stage_norm_and_head_on_the_last():
    # Layers: 0 embedding, 1-4 blocks, 5 final norm, 6 output head.
    assert stage_bounds(4, 2) == [(0, 3), (3, 7)]


def test_more_stages_than_blocks_is_refused():
    with pytest.raises(
        ValueError, match=r"parallel\.pp=5 > model\.n_layer=4: each pipeline stage needs at least one"
    ):
        stage_bounds(4, 5)


@pytest.mark.parametrize("tied", [True, False])
def test_stages_hold_the_model_once_plus_the_tied_copy(tied):
    model = dataclasses.replace(TINY, tie_embeddings=tied)
    stages = stage_param_numels(model, 2)
    tied_copy = model.vocab_size * model.d_model if tied else 0
    assert sum(map(sum, stages)) == num_params(model) + tied_copy
    # Measured on 2 ranks (tests/multirank/test_pipeline_two_ranks.py): 1,647,616 and 1,647,872 parameters.
    if tied:
        assert [sum(s) for s in stages] == [1_647_616, 1_647_872]


def test_the_fullest_rank_holds_the_fullest_stage_split_by_tp():
    assert sum(rank_param_numels(TINY, pp=2)) == 1_647_872  # the last stage: 2 blocks, norm, tied head
    assert rank_param_numels(TINY) == rank_param_numels(TINY, pp=1)
    # Under tp each stage's block matrices and the (tied) embedding-head are split, its norms whole.
    h, v = TINY.d_model, TINY.vocab_size
    first, last = stage_param_numels(TINY, 2, tp=2)
    assert first == [v * h // 2, *layer_param_numels(TINY, tp=2) * 2]
    assert last == [*layer_param_numels(TINY, tp=2) * 2, h, v * h // 2]
    assert (
        layer_param_numels(TINY, tp=2)
        == [h, h * h // 2, h * h // 2, h * h // 2, h * h // 2, h] + [h * TINY.ffn_hidden // 2] * 3
    )


def test_stage_activations_add_up_to_the_whole_model():
    block = BlockShape(seq_len=128, micro_size=4, d_model=256, n_heads=4, flash=True, bytes_per_elem=4)
    items = activation_items_total(block, n_layers=4, vocab_size=256)
    whole = sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)
    per_stage = stage_activations(items, n_layer=4, pp=2)
    assert sum(per_stage) == whole
    assert per_stage[1] > per_stage[0]  # the last stage keeps the loss's log-probabilities


def test_a_pipeline_checkpoint_moves_to_any_layout():
    pipelined = resolve_layout(gpus=2, tp=1, pp=2, global_size=16, micro_size=4)
    plain = resolve_layout(gpus=1, tp=1, pp=1, global_size=16, micro_size=4)
    wider = resolve_layout(gpus=4, tp=1, pp=2, global_size=16, micro_size=4)
    record = {"tag": "step_00000002", "layout": pipelined.to_json(), "zero_stage": 0}
    for layout in (pipelined, wider, plain):  # stage 0: its own files at any dp, converted onto pp 1
        checkpoint.check_resumable(record, layout=layout, zero_stage=0)
    assert not checkpoint.needs_universal(record, layout=wider, zero_stage=0)
    assert checkpoint.needs_universal(record, layout=plain, zero_stage=0)

    zero1 = {**record, "zero_stage": 1}
    for layout, stage in ((plain, 1), (plain, 3), (wider, 1)):
        checkpoint.check_resumable(zero1, layout=layout, zero_stage=stage)
        assert checkpoint.needs_universal(zero1, layout=layout, zero_stage=stage)
        assert checkpoint.universal_tag_for(zero1, layout).endswith(
            "_universal" + "_pipeline" * (layout.pp > 1)
        )

    three_d = resolve_layout(gpus=4, tp=2, pp=2, global_size=16, micro_size=4)
    checkpoint.check_resumable(zero1, layout=three_d, zero_stage=1)  # a pipeline onto tp x pp
    assert checkpoint.universal_tag_for(zero1, three_d).endswith("_universal_pipeline")


def test_a_tp_x_pp_checkpoint_moves_to_any_layout_once_it_records_every_stages_splits():
    three_d = resolve_layout(gpus=4, tp=2, pp=2, global_size=16, micro_size=4)
    plain = resolve_layout(gpus=1, tp=1, pp=1, global_size=16, micro_size=4)
    record = {
        "tag": "step_00000004",
        "layout": three_d.to_json(),
        "zero_stage": 1,
        checkpoint_record.STAGE_SPLITS: True,
    }
    for layout in (plain, resolve_layout(gpus=2, tp=2, pp=1, global_size=16, micro_size=4)):
        checkpoint.check_resumable(record, layout=layout, zero_stage=2)
    earlier = {key: value for key, value in record.items() if key != checkpoint_record.STAGE_SPLITS}
    checkpoint.check_resumable(earlier, layout=three_d, zero_stage=1)  # its own layout: DeepSpeed's files
    with pytest.raises(ValueError, match=r"without the record.*own layout only: keep gpus=4 parallel\.pp=2"):
        checkpoint.check_resumable(earlier, layout=plain, zero_stage=1)


def test_the_stages_splits_join_without_repeats():
    from runner.checkpoint.tp_splits import union_of_splits

    first = {
        "universal_checkpoint_version": 0.4,
        "tp_replicated_parameter_patterns": ["^1\\.block\\.ffn_norm\\.weight$"],
        "affine_map": {"version": 1, "params": {"^1\\.block\\.wo\\.weight$": {"logical_shape": [8, 8]}}},
    }
    last = {
        "universal_checkpoint_version": 0.4,
        "tp_replicated_parameter_patterns": ["^1\\.block\\.ffn_norm\\.weight$", "^5\\.weight$"],
        "affine_map": {"version": 1, "params": {"^4\\.block\\.wo\\.weight$": {"logical_shape": [8, 8]}}},
        "original_vocab_size": 256,
    }
    joined = union_of_splits(first, last)
    assert joined["tp_replicated_parameter_patterns"] == ["^1\\.block\\.ffn_norm\\.weight$", "^5\\.weight$"]
    assert sorted(joined["affine_map"]["params"]) == [
        "^1\\.block\\.wo\\.weight$",
        "^4\\.block\\.wo\\.weight$",
    ]
    assert joined["original_vocab_size"] == 256 and joined["affine_map"]["version"] == 1
    with pytest.raises(ValueError, match="different universal-checkpoint values"):
        union_of_splits(first, {**last, "universal_checkpoint_version": 0.3})


@pytest.mark.parametrize("tied", [True, False])
def test_every_parameter_has_one_name_in_the_pipeline_and_one_in_the_plain_model(tied):
    """The renaming a checkpoint goes through between a pipeline and a plain layout is one to one."""
    from runner.model.transformer import Transformer
    from runner.parallel.pipeline_names import model_name, pipeline_name

    cfg = dataclasses.replace(ModelConfig(), tie_embeddings=tied)
    with torch.device("meta"):
        names = [name for name, _ in Transformer(cfg).named_parameters()]
    piped = [pipeline_name(cfg, name) for name in names]
    assert len(set(piped)) == len(names)
    assert [model_name(cfg, name) for name in piped] == names
    assert ("tied_modules.embed.weight" in piped) == tied
    assert f"{cfg.n_layer + 1}.weight" in piped  # the final norm, after the blocks
