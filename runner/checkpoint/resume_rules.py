"""Which checkpoint a layout can resume, and from which files: the rules, decided without I/O.

A checkpoint resumes as it is on the layout that wrote it. Onto another layout (other dp, tp
or ZeRO stage) it goes through DeepSpeed's universal checkpoint, converted once next to the
original (runner/checkpoint/universal_conversion.py); a ZeRO engine, and a stage-0 one in
bf16 under a pipeline or under tensor parallelism, reads that itself, any other stage-0 one
reads stage-0 files written from it. :func:`check_resumable` refuses, before any rank
starts, what cannot move: another global batch, an optimizer without Adam's state, a
tp x pp ZeRO checkpoint without every stage's splits.
"""

from __future__ import annotations

from runner.config import OptimizerName, Precision, ZeroStage
from runner.engine.optimizer_wrapper import OptimizerWrapper, optimizer_wrapper
from runner.layout import Layout
from runner.rundir.checkpoint_record import STAGE_SPLITS, UNIVERSAL_SUFFIX, CheckpointRecord, own_layout

PIPELINE_VIEW_SUFFIX = "_pipeline"  # the universal checkpoint under a pipeline's parameter names
STAGE0_SUFFIX = "_ddp"  # the universal checkpoint as a stage-0 engine's own file


def needs_universal(record: CheckpointRecord, *, layout: Layout, zero_stage: ZeroStage | int) -> bool:
    """Whether resuming ``record`` on this layout needs DeepSpeed's universal checkpoint."""
    saved = record["layout"]
    saved_split = (saved.get("tp", 1), saved.get("pp", 1))
    # ZeRO cuts over the data- and sequence-parallel ranks together (runner/layout.py zero_ranks);
    # a record from before sequence parallelism has no sp: 1.
    saved_ranks = saved["dp"] * saved.get("sp", 1)
    saved_stage0 = ZeroStage(record["zero_stage"]) is ZeroStage.ddp
    if saved_stage0 and ZeroStage(zero_stage) is ZeroStage.ddp and saved_split == (layout.tp, layout.pp):
        # Stage 0 saves the whole model and optimizer state once per model-parallel rank
        # (mp_rank_XX_model_states.pt, or a pipeline's layer_XX files), which DeepSpeed
        # loads as it is at any dp; but in bf16 under a pipeline its BF16_Optimizer cuts
        # the optimizer state over the data-parallel ranks, like ZeRO-1. A record that
        # names no precision is not taken for bf16.
        saved_precision = record.get("precision")
        cut_over_dp = (
            saved_precision is not None
            and optimizer_wrapper(precision=saved_precision, zero_stage=ZeroStage.ddp, pp=layout.pp)
            is OptimizerWrapper.bf16_optimizer
        )
        return cut_over_dp and saved_ranks != layout.zero_ranks
    now = (layout.zero_ranks, layout.tp, layout.pp, zero_stage)
    return (saved_ranks, *saved_split, record["zero_stage"]) != now


def check_resumable(
    record: CheckpointRecord,
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    optimizer: OptimizerName | str = OptimizerName.adamw,
) -> None:
    """Refuse a resume ladder cannot do, before any rank starts."""
    saved = record["layout"]
    if saved["global_size"] != layout.global_size:
        raise ValueError(
            f"train.resume=auto: the checkpoint trained with batch.global_size={saved['global_size']}, "
            f"this run asks {layout.global_size}; a different global batch is a different experiment: "
            f"set batch.global_size={saved['global_size']} or start a new run directory"
        )
    if not needs_universal(record, layout=layout, zero_stage=zero_stage):
        return
    if optimizer != OptimizerName.adamw:
        # The conversions carry a moment-free optimizer's fp32 weights too (ladder export reads
        # them: runner/engine/fixes/stateless_optimizer_universal.py), but the way back into a
        # stage-0 checkpoint (runner/checkpoint/stage0.py from_universal) rebuilds Adam's state.
        raise ValueError(
            f"train.resume=auto: {record['tag']} would move to another layout through DeepSpeed's "
            f"universal format, which carries Adam's state only "
            f"(optimizer={OptimizerName(optimizer).value} has none of it): resume on the checkpoint's "
            f"own layout ({own_layout(record)}), or start a new run directory"
        )
    cut_both_ways = saved.get("pp", 1) > 1 and saved.get("tp", 1) > 1
    saved_zero = ZeroStage(record["zero_stage"]) is not ZeroStage.ddp
    if cut_both_ways and saved_zero and not record.get(STAGE_SPLITS):
        # Without every stage's splits ds_to_universal joins a stage's shards along dimension 0,
        # wrong for the row-split and whole tensors: a ZeRO checkpoint of an earlier ladder.
        # (ladder joins a stage-0 checkpoint's shards itself: runner/checkpoint/stage0_pipeline.py.)
        raise ValueError(
            f"train.resume=auto: the checkpoint {record['tag']} was written at pp {saved['pp']}, tp "
            f"{saved['tp']} without the record of how every stage split its tensors, so it resumes on "
            f"its own layout only: keep gpus={saved['gpus']} parallel.pp={saved['pp']} "
            f"parallel.tp={saved['tp']} parallel.zero_stage={record['zero_stage']}, or start a new run "
            f"directory"
        )


def universal_tag_for(record: CheckpointRecord, layout: Layout) -> str:
    """The tag a ZeRO rank of ``layout`` loads ``record`` from when it resumes through the universal one."""
    tag = record["tag"] + UNIVERSAL_SUFFIX
    return tag + PIPELINE_VIEW_SUFFIX if layout.pp > 1 else tag


def universal_engine(layout: Layout, zero_stage: ZeroStage | int, precision: Precision) -> bool:
    """Whether this layout's engine loads a universal checkpoint itself: where its optimizer
    wrapper is ZeRO's (stages 1-3) or BF16_Optimizer (stage 0 in bf16 under a pipeline:
    runner/checkpoint/stage0_pipeline.py), and at stage 0 under tensor parallelism (its ranks
    slice it: runner/checkpoint/stage0_tp.py)."""
    wrapper = optimizer_wrapper(precision=precision, zero_stage=zero_stage, pp=layout.pp)
    loads_itself = (
        OptimizerWrapper.zero_optimizer,
        OptimizerWrapper.zero3_optimizer,
        OptimizerWrapper.bf16_optimizer,
    )
    return wrapper in loads_itself or layout.tp > 1


def resume_tag(
    record: CheckpointRecord,
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    precision: Precision = Precision.fp32,
) -> str:
    """The tag the ranks of ``layout`` at ``zero_stage`` in ``precision`` load ``record`` from."""
    if not needs_universal(record, layout=layout, zero_stage=zero_stage):
        return str(record["tag"])
    if not universal_engine(layout, zero_stage, precision):
        return record["tag"] + UNIVERSAL_SUFFIX + STAGE0_SUFFIX
    return universal_tag_for(record, layout)


def loads_universal(
    record: CheckpointRecord,
    *,
    layout: Layout,
    zero_stage: ZeroStage | int,
    precision: Precision = Precision.fp32,
) -> bool:
    """Whether DeepSpeed reads the resume's files in the universal format (onto another layout)."""
    universal = universal_engine(layout, zero_stage, precision)
    return universal and needs_universal(record, layout=layout, zero_stage=zero_stage)
