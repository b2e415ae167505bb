"""Tensor parallel: the partition AutoTP gets, DeepSpeed's batch count, the per-rank estimate, refusals."""

from __future__ import annotations

import dataclasses
import re

import pytest
from train_helpers import memory_case

from runner.config import (
    ModelConfig,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    Precision,
    PrecisionConfig,
)
from runner.engine.deepspeed_config import build_deepspeed_config
from runner.layout import resolve_layout
from runner.metrics.ledger import RankBatch, deepspeed_estimate
from runner.model.transformer import build_model, num_params
from runner.parallel.tensor import partition_config
from runner.rules import tp_node_problems, tp_problems

pytestmark = pytest.mark.unit

TINY = ModelConfig(
    name="tiny", n_layer=4, n_head=4, d_model=256, ffn_hidden=688, vocab_size=256, tie_embeddings=True
)


def _spec_for(name: str) -> str | None:
    """The partition type AutoTP picks for a parameter name: its first matching spec, as it does."""
    for spec in partition_config()["layer_specs"]:
        if any(re.match(pattern, name) for pattern in spec["patterns"]):
            return spec["partition_type"]
    return None


def test_partition_splits_blocks_and_replicates_the_rest():
    """Megatron-LM's split: wq wk wv w1 w3 by columns, wo w2 by rows, nothing else."""
    model = build_model(TINY, device="meta")
    expected = {"wq": "column", "wk": "column", "wv": "column", "w1": "column", "w3": "column"}
    expected |= {"wo": "row", "w2": "row"}
    for name, _ in model.named_parameters():
        leaf = name.split(".")[-2]
        assert _spec_for(name) == expected.get(leaf), name
    # The tied output head is not a parameter of its own; an untied one stays whole too.
    assert _spec_for("output.weight") is None and _spec_for("tok_embeddings.weight") is None


def test_deepspeed_config_carries_autotp_and_its_batch_count():
    """Stages 0-2 count tp ranks as dp in train_batch_size; stage 3 takes none."""
    layout = resolve_layout(gpus=2, tp=2, pp=1, global_size=16, micro_size=4)
    assert (layout.dp, layout.accum_steps) == (1, 4)

    def build(stage: int) -> dict:
        return build_deepspeed_config(
            layout=layout,
            model=ModelConfig(),
            parallel=ParallelConfig(zero_stage=stage, tp=2),
            precision=PrecisionConfig(),
            optimizer=OptimizerConfig(),
            lr=1e-3,
        )

    for stage in (0, 1, 2):
        config = build(stage)
        assert config["train_batch_size"] == 16 * 2
        assert config["tensor_parallel"]["autotp_size"] == 2
        assert config["tensor_parallel"]["partition_config"]["use_default_specs"] is False
    assert "train_batch_size" not in build(3)
    plain = resolve_layout(gpus=2, tp=1, pp=1, global_size=16, micro_size=4)
    config = build_deepspeed_config(
        layout=plain,
        model=ModelConfig(),
        parallel=ParallelConfig(),
        precision=PrecisionConfig(),
        optimizer=OptimizerConfig(),
        lr=1e-3,
    )
    assert "tensor_parallel" not in config and config["train_batch_size"] == 16


def test_deepspeed_parses_the_section():
    """DeepSpeed's own model of the section, and its partition config object, accept it."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.tensor_parallel.config import get_tensor_parallel_config

    layout = resolve_layout(gpus=2, tp=2, pp=1, global_size=16, micro_size=4)
    config = build_deepspeed_config(
        layout=layout,
        model=ModelConfig(),
        parallel=ParallelConfig(zero_stage=1, tp=2),
        precision=PrecisionConfig(),
        optimizer=OptimizerConfig(),
        lr=1e-3,
    )
    parsed = get_tensor_parallel_config(config).get_partition_config_object()
    assert parsed.tp_size == 2 and len(parsed.layer_specs) == 2
    assert parsed.find_matching_spec("layers.3.feed_forward.w2.weight").partition_type.value == "row"
    assert parsed.find_matching_spec("norm.weight") is None


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_estimate_halves_all_but_the_norms(stage):
    """Per rank at tp 2: half of the block matrices and of the tied embedding-head, the norms whole."""

    def estimate(tp: int):
        return deepspeed_estimate(
            model=TINY,
            parallel=ParallelConfig(zero_stage=stage, tp=tp),
            precision=Precision.fp32,
            optimizer=OptimizerName.adamw,
            host_is_device=True,
            batch=RankBatch(dp=1, micro_size=4, seq_len=128),
        )

    h, L = TINY.d_model, TINY.n_layer
    whole = (2 * L + 1) * h  # 2 norms per block, the final norm
    local = (num_params(TINY) - whole) // 2 + whole
    full, split = estimate(1), estimate(2)
    assert split.terms["params"] == 4 * local  # fp32 bytes
    assert split.terms["grads"] == 4 * local
    assert split.terms["optimizer"] == 8 * local  # Adam's m and v
    # Measured on 2 CPU ranks (tiny, fp32, micro 4, stage 0): 6,464,512 B of parameters.
    assert split.terms["params"] == 6_464_512
    assert split.terms["activations"] < full.terms["activations"]


def test_refusals_name_the_key_and_the_values_that_work():
    assert tp_problems(TINY, tp=1) == [] and tp_problems(TINY, tp=2) == []
    (heads,) = tp_problems(dataclasses.replace(TINY, n_head=2, d_model=256), tp=4)
    assert "parallel.tp=4" in heads and "model.n_head=2" in heads and "{1, 2}" in heads
    (ffn,) = tp_problems(dataclasses.replace(TINY, ffn_hidden=690), tp=4)
    assert "model.ffn_hidden=690" in ffn
    gqa = tp_problems(dataclasses.replace(TINY, n_head=8, n_kv_head=2), tp=4)
    assert len(gqa) == 1 and "model.n_kv_head=2" in gqa[0]
    assert tp_node_problems(8, ranks_per_node=8, where="x") == []
    (node,) = tp_node_problems(16, ranks_per_node=8, where="cluster=h100_sxm (8 gpus per node)")
    assert "parallel.tp=16" in node and "{1, 2, 4, 8}" in node


@pytest.mark.parametrize(("tied", "measured"), [(True, 6_464_512), (False, 6_595_584)])
def test_planner_counts_the_vocabulary_split_embeddings(tied, measured):
    """At tp 2 a rank holds half of each block matrix, of the output head and of the token
    embedding (one weight when tied); the norms stay whole. Measured per rank on 2 CPU ranks."""
    from runner.memory_model.peak import memory_terms

    model = dataclasses.replace(TINY, tie_embeddings=tied)
    terms = memory_terms(
        memory_case(
            model=model,
            precision="fp32",
            optimizer="adamw",
            zero_stage=0,
            offload="none",
            recompute="none",
            seq_len=128,
            micro_size=4,
            dp=1,
            tp=2,
            pp=1,
            accum_steps=4,
        )
    )
    assert terms.params == measured  # fp32 bytes
    h, v = model.d_model, model.vocab_size
    norms = (2 * model.n_layer + 1) * h
    whole_embeddings = v * h * (1 if tied else 2)
    matrices = num_params(model) - whole_embeddings - norms
    split_embeddings = whole_embeddings // 2
    assert terms.params == 4 * (matrices // 2 + norms + split_embeddings)


def test_a_zero_tensor_parallel_checkpoint_moves_to_any_layout_through_the_universal_one():
    """AutoTP's shards are joined by DeepSpeed's conversion at ZeRO 1-3, by ladder's at stage 0."""
    from runner.checkpoint.resume_rules import check_resumable, needs_universal

    saved = resolve_layout(gpus=2, tp=2, pp=1, global_size=16, micro_size=4)
    record = {"tag": "step_00000004", "layout": saved.to_json(), "zero_stage": 1}
    check_resumable(record, layout=saved, zero_stage=1)  # same layout: DeepSpeed's own files
    assert not needs_universal(record, layout=saved, zero_stage=1)
    for gpus, tp, stage in ((1, 1, 1), (4, 2, 2), (2, 1, 3), (4, 4, 1)):
        other = resolve_layout(gpus=gpus, tp=tp, pp=1, global_size=16, micro_size=4)
        check_resumable(record, layout=other, zero_stage=stage)
        assert needs_universal(record, layout=other, zero_stage=stage)

    one = resolve_layout(gpus=1, tp=1, pp=1, global_size=16, micro_size=4)
    zero3 = {**record, "zero_stage": 3}
    check_resumable(zero3, layout=saved, zero_stage=3)
    check_resumable(zero3, layout=one, zero_stage=1)  # its norms' maps get their whole shapes
    assert needs_universal(zero3, layout=one, zero_stage=1)
    ddp = {**record, "zero_stage": 0}
    wider = resolve_layout(gpus=4, tp=2, pp=1, global_size=16, micro_size=4)
    check_resumable(ddp, layout=wider, zero_stage=0)  # stage 0 at its own tp: any dp
    assert not needs_universal(ddp, layout=wider, zero_stage=0)
    check_resumable(ddp, layout=one, zero_stage=0)  # joined into the universal one (checkpoint_stage0)
    assert needs_universal(ddp, layout=one, zero_stage=0)


def test_a_failed_conversion_is_refused_with_deepspeeds_word_and_the_checkpoints_own_layout(tmp_path):
    from runner.checkpoint.universal_conversion import _unconverted

    saved = resolve_layout(gpus=4, tp=2, pp=1, global_size=16, micro_size=4)
    record = {"tag": "step_00000004", "layout": saved.to_json(), "zero_stage": 3}
    (tmp_path / "mp_rank_00_model_states.pt").write_bytes(b"x" * 2_000_000)
    stderr = "Traceback ...\nValueError: Rank 0 supplied a shard of 256 elements\n"
    message = _unconverted(record, stderr, tmp_path)
    assert "could not convert step_00000004" in message
    assert "ValueError: Rank 0 supplied a shard of 256 elements (" in message
    assert "the universal copy goes beside the checkpoint (0.002 GB) on a filesystem with" in message
    assert "(gpus=4 parallel.tp=2 parallel.zero_stage=3)" in message
    assert message.startswith("train.resume=auto: ")
    # the same failure met by ladder export names that command and an export's way out
    exported = _unconverted(record, stderr, tmp_path, "ladder export")
    assert exported.startswith("ladder export: ") and "train.resume" not in exported
    assert "--step N" in exported
