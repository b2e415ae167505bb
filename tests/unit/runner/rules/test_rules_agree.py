"""plan=true and the refusal before launch give one verdict on a layout, in the same words.

The same configs go to the planner (runner/plan/planner.py ``plan_config``: the checks the ladder
relies on too), to plan=true's own check (runner/preflight/validate.py with no launcher) and to
the refusal before a launch (validate under torchrun, so this host's cores and devices do not
enter). A layout no plan can size is refused by all three; one a plan sizes but the runner does
not start is marked "plan only" by the planner and refused at launch; the problem text is the
same everywhere: each rule is one function of runner/rules/.
"""

from __future__ import annotations

import pytest
from train_helpers import compose_config

from runner.config import TrainConfig
from runner.errors import ConfigError
from runner.memory_model.activations import BlockShape
from runner.memory_model.states import model_states
from runner.parallel.pipeline_split import stage_bounds
from runner.plan.planner import plan_config
from runner.preflight.validate import validate

pytestmark = pytest.mark.unit

# A named device: the plan reads its figures and measures nothing on this host. No sink asks for
# credentials.
COMMON = ("cluster=h100_sxm", "logger=none")

RUNS, REFUSED, PLAN_ONLY = "runs", "refused", "plan only"

# (overrides, verdict, fragments the problems must hold), on the tiny model: 4 layers,
# 4 heads of d_model 256, MLP 688 wide.
CASES = [
    (["parallel=ddp", "gpus=2"], RUNS, []),
    (["parallel=zero3_offload", "gpus=2"], RUNS, []),
    (["parallel=zero2_offload", "gpus=2"], RUNS, []),
    (["parallel=tp2", "gpus=2"], RUNS, []),
    (["parallel=pp2", "gpus=2"], RUNS, []),
    (["parallel=tp2pp2", "gpus=4"], RUNS, []),
    # ZeRO-Offload's stages
    (["parallel=ddp", "parallel.offload_optimizer=cpu"], REFUSED, ["zero_stage=0", "parallel=zero2"]),
    (
        ["parallel=zero2", "parallel.offload_optimizer=cpu", "parallel.offload_param=cpu"],
        REFUSED,
        ["parallel.offload_param=cpu with parallel.zero_stage=2", "parallel=zero3"],
    ),
    (
        ["parallel=zero2", "parallel.offload_param=cpu"],
        REFUSED,
        ["stage 3 only", "without parallel.offload_optimizer=cpu"],
    ),
    (["parallel=zero3", "parallel.offload_param=cpu"], REFUSED, ["ZeRO-Infinity order"]),
    # what tensor parallelism splits: query heads, key/value heads, the MLP's width
    (["parallel.tp=3", "gpus=3"], REFUSED, ["model.n_head=4", "model.ffn_hidden=688", "{1, 2, 4}"]),
    (
        ["parallel.tp=2", "model.n_head=8", "model.n_kv_head=1", "gpus=2"],
        REFUSED,
        ["model.n_kv_head=1", "key/value heads"],
    ),
    (["parallel.tp=2", "model.ffn_hidden=689", "gpus=2"], REFUSED, ["model.ffn_hidden=689", "{1, 13, 53}"]),
    # a tensor-parallel group inside one node (h100_sxm: 8 gpus per node)
    (["parallel.tp=16", "model.n_head=16", "gpus=16"], REFUSED, ["(8 gpus per node)", "{1, 2, 4, 8}"]),
    # the heads themselves
    (["model.n_kv_head=3"], REFUSED, ["model.n_kv_head=3", "model.n_head=4"]),
    (["model.n_head=256"], REFUSED, ["model.d_model=256 / model.n_head=256 = 1: an odd head size"]),
    # a pipeline: a block on every stage (no plan), DeepSpeed's engine's stages and no offload (plan only)
    (["parallel=ddp", "parallel.pp=8", "gpus=8"], REFUSED, ["model.n_layer=4", "parallel.pp <= 4"]),
    (["parallel=zero2", "parallel.pp=2", "gpus=2"], PLAN_ONLY, ["ZeRO-2 and ZeRO-3", "parallel=pp2"]),
    (["parallel=zero3", "parallel.pp=2", "gpus=2"], PLAN_ONLY, ["parallel.zero_stage=3"]),
    (["parallel=pp2", "parallel.offload_optimizer=cpu", "gpus=2"], PLAN_ONLY, ["with CPU offload"]),
    # the loss in pieces: the whole-logits layouts keep their own loss; a piece needs a token
    (["model.loss_tiles=4"], RUNS, []),
    (
        ["model.loss_tiles=4", "parallel=tp2", "gpus=2"],
        REFUSED,
        ["model.loss_tiles=4 with parallel.tp=2", "null"],
    ),
    (
        ["model.loss_tiles=4", "parallel=pp2", "gpus=2"],
        REFUSED,
        ["model.loss_tiles=4 with parallel.pp=2", "null"],
    ),
    (["model.loss_tiles=4", "parallel=tp2", "gpus=2", "model.loss_tiles=1"], RUNS, []),
    # op-level selective recompute chooses among eager ops: not a compiled block's
    (["model.activation_checkpointing=selective"], RUNS, []),
    (["model.activation_checkpointing=attention", "train.compile=true"], RUNS, []),
    (
        ["model.activation_checkpointing=selective", "train.compile=true"],
        REFUSED,
        ["model.activation_checkpointing=selective with train.compile=true", "full or attention"],
    ),
    (
        ["model.loss_tiles=200", "data.seq_len=128"],
        REFUSED,
        ["model.loss_tiles=200 > data.seq_len=128", "at most 128"],
    ),
    # the MLP in pieces (DeepSpeed's TiledMLP): a piece needs a token, and the blocks run eagerly
    (["model.mlp_tiles=4", "parallel=zero3", "gpus=2", "model.activation_checkpointing=full"], RUNS, []),
    (
        ["model.mlp_tiles=200", "data.seq_len=128"],
        REFUSED,
        ["model.mlp_tiles=200 > data.seq_len=128", "at most 128"],
    ),
    (
        ["model.mlp_tiles=4", "train.compile=true"],
        REFUSED,
        ["model.mlp_tiles=4 with train.compile=true", "model.mlp_tiles=1 or train.compile=false"],
    ),
    # sequence parallelism: it splits the sequence and both head counts, beside ZeRO only
    (["parallel=zero1", "parallel.sp=2", "gpus=2"], RUNS, []),
    (["parallel=zero3_offload", "parallel.sp=2", "gpus=2"], RUNS, []),
    (
        ["parallel.sp=3", "gpus=3"],
        REFUSED,
        ["parallel.sp=3 does not divide model.n_head=4", "data.seq_len=128", "use parallel.sp in {1, 2, 4}"],
    ),
    (
        ["parallel.sp=2", "model.n_head=8", "model.n_kv_head=1", "gpus=2"],
        REFUSED,
        ["parallel.sp=2 does not divide model.n_kv_head=1", "key/value heads", "{1}"],
    ),
    (
        ["parallel=tp2", "parallel.sp=2", "gpus=4"],
        REFUSED,
        ["parallel.sp=2 with parallel.tp=2 and parallel.pp=1", "set parallel.tp=1 parallel.pp=1"],
    ),
    (
        ["parallel=pp2", "parallel.sp=2", "gpus=4"],
        REFUSED,
        ["parallel.sp=2 with parallel.tp=1 and parallel.pp=2", "or set parallel.sp=1"],
    ),
    # the checkpointed blocks' inputs on the host: full recompute's one tensor, outside a pipeline
    (["model.offload_activations=true", "model.activation_checkpointing=full"], RUNS, []),
    (
        ["model.offload_activations=true"],
        REFUSED,
        [
            "model.offload_activations=true with model.activation_checkpointing=none",
            "set model.activation_checkpointing=full or model.offload_activations=false",
        ],
    ),
    (
        ["model.offload_activations=true", "model.activation_checkpointing=full", "parallel=pp2", "gpus=2"],
        REFUSED,
        ["model.offload_activations=true with parallel.pp=2", "parallel.pp=1"],
    ),
]


def _lines(error: ConfigError) -> list[str]:
    return [line.removeprefix("  - ") for line in str(error).splitlines()]


def _refused(config: TrainConfig, *, launcher: str | None) -> list[str]:
    """The problems validate refuses ``config`` with (empty: none)."""
    try:
        validate(config, launcher=launcher)
    except ConfigError as error:
        return _lines(error)
    return []


def _planned(config: TrainConfig) -> tuple[str, list[str]]:
    """The planner's verdict and its words: refused, plan only (why), or runs."""
    try:
        plan = plan_config(config)
    except ConfigError as error:
        return REFUSED, _lines(error)
    return (PLAN_ONLY, plan.plan_only) if plan.plan_only else (RUNS, [])


@pytest.mark.parametrize(("overrides", "verdict", "fragments"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_the_plan_and_the_launch_refuse_a_layout_alike(overrides, verdict, fragments):
    config = compose_config(*COMMON, *overrides)
    planned, plan_words = _planned(config)
    at_launch = _refused(config, launcher="torchrun")
    before_plan = _refused(config, launcher=None)  # plan=true asks this before it plans
    assert planned == verdict
    assert plan_words == at_launch  # the same problems, in the same words and order
    assert before_plan == (at_launch if verdict == REFUSED else [])
    for fragment in fragments:
        assert any(fragment in line for line in at_launch), (fragment, at_launch)


def test_the_estimators_own_checks_say_the_rules_words():
    """The memory estimator and the stage split assert the rules a plan refused already, in its words."""
    plan_words = _planned(compose_config(*COMMON, "parallel=ddp", "parallel.offload_optimizer=cpu"))[1]
    with pytest.raises(ValueError) as offload:
        model_states(100, zero_stage=0, dp=2, offload="optimizer")
    assert str(offload.value) == plan_words[0]
    tp_words = _planned(compose_config(*COMMON, "parallel.tp=3", "gpus=3"))[1]
    with pytest.raises(ValueError) as split:
        BlockShape(seq_len=128, micro_size=1, d_model=256, n_heads=4, ffn_hidden=688, tp=3)
    assert str(split.value) == "; ".join(tp_words)
    depth_words = _planned(compose_config(*COMMON, "parallel.pp=8", "gpus=8"))[1]
    with pytest.raises(ValueError) as depth:
        stage_bounds(4, 8)
    assert str(depth.value) == depth_words[0]
