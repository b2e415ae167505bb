"""planner.recommend ranks every layout that fits by predicted tokens/s; batch.micro_size=auto takes
the predicted fastest (planner.objective=speed) or the largest (memory) of the sizes that fit."""

from __future__ import annotations

import dataclasses
import re

import pytest
from train_helpers import compose_config, plan_json

from launchers.plan_job import plan_job
from runner.config import Objective, Recompute, TrainConfig, ZeroStage
from runner.errors import ConfigError
from runner.exit_codes import ExitCode
from runner.layout import divisors
from runner.plan.ladder import NEAR_FASTEST, SHOWN, recommend
from runner.plan.micro_fit import SPEED_TIE, MicroFit
from runner.plan.planner import layout_for_config, plan_config, workload_from_config
from runner.preflight.validate import validate
from runner.report.plan_table import format_ladder

pytestmark = pytest.mark.unit

LLAMA_7B_ON_ONE_H200 = (
    "model=llama_7b",
    "cluster=h200",
    "gpus=1",
    "precision=bf16",
    "batch.global_size=16",
    "data.seq_len=2048",
)


def _config(*overrides: str) -> TrainConfig:
    config: TrainConfig = compose_config(*overrides)
    return config


def _ranked_rows(text: str) -> list[str]:
    """The printed ranking: the numbered rows after 'fastest first', before 'recommended:'."""
    block = text.split("fastest first", 1)[1].split("\nrecommended:", 1)[0]
    return [line for line in block.splitlines() if re.match(r"  \d+\. ", line)]


def test_llama_7b_on_one_h200_is_ranked_by_predicted_speed():
    ladder = recommend(workload_from_config(_config(*LLAMA_7B_ON_ONE_H200)))
    assert ladder.winner is not None and len(ladder.ranking) > 1
    speeds = [c.tokens_per_s for c in ladder.ranking]
    assert speeds == sorted(speeds, reverse=True)
    # Every micro-batch that fits is a candidate, not only the largest: some knobs appear at several.
    per_knobs: dict[tuple[object, ...], set[int]] = {}
    for c in ladder.ranking:
        k = c.plan.knobs
        per_knobs.setdefault((k.spec.zero_stage, k.spec.recompute, k.spec.offload), set()).add(
            c.plan.layout.micro_size
        )
    assert max(len(sizes) for sizes in per_knobs.values()) > 1
    # The recommendation: the cheapest within NEAR_FASTEST of the fastest.
    win = ladder.winner
    near = [c for c in ladder.ranking if c.tokens_per_s >= (1 - NEAR_FASTEST) * speeds[0]]
    assert win in near and win.cheapness == min(c.cheapness for c in near)
    plan = win.plan
    lazy = (
        plan.knobs.spec.zero_stage,
        plan.knobs.spec.recompute,
        plan.layout.micro_size,
        plan.layout.accum_steps,
    )
    if lazy == (ZeroStage.zero3, Recompute.none, 1, 16):  # the first that fits, as the walk chose
        assert win is ladder.ranking[0] or win.tokens_per_s >= (1 - NEAR_FASTEST) * speeds[0]
    text = format_ladder(ladder)
    rows = _ranked_rows(text)
    assert 1 < len(rows) <= SHOWN
    assert all("tokens/s, step " in row and ", MFU " in row and ", limit " in row for row in rows)
    assert ladder.command in text and "cheapest rung that fits: zero3" in text


def test_llama_70b_on_64_h100s_ranks_its_layouts_into_plan_json(tmp_path, capsys):
    config = _config(
        "model=llama_70b",
        "cluster=h100_sxm",
        "gpus=64",
        "precision=bf16",
        "batch.global_size=512",
        "data.seq_len=4096",
        "planner.recommend=true",
    )
    record = plan_job(config, run_dir=tmp_path)
    assert record.exit_code == ExitCode.OK
    recommendation = plan_json(tmp_path)["recommendation"]
    ranking = recommendation["ranking"]
    assert len(ranking) > SHOWN and [r["rank"] for r in ranking] == list(range(1, len(ranking) + 1))
    speeds = [r["tokens_per_s"] for r in ranking]
    assert speeds == sorted(speeds, reverse=True)
    chosen = ranking[recommendation["winner_rank"] - 1]
    assert chosen["overrides"] == recommendation["overrides"]
    assert chosen["tokens_per_s"] >= (1 - NEAR_FASTEST) * speeds[0]
    assert len(_ranked_rows(capsys.readouterr().out)) == SHOWN


def _fits_and_steps(config: TrainConfig) -> tuple[list[int], dict[int, float]]:
    """The micro-batch sizes of a run that fit its device, and each one's predicted step."""
    plan = plan_config(config)
    lay = plan.layout
    per_rank = lay.global_size // lay.dp
    fit = MicroFit(plan.workload, plan.knobs, dp=lay.dp, per_rank=per_rank)
    sizes = [m for m in divisors(per_rank) if fit(m) and (lay.dp > 1 or m < per_rank)]
    steps = {m: fit.step_s(m) for m in sizes}
    assert all(s is not None for s in steps.values())
    return sizes, {m: s for m, s in steps.items() if s is not None}


def test_auto_by_memory_keeps_the_largest_and_by_speed_the_largest_near_the_fastest():
    base = ("model=llama_7b", "cluster=h200", "gpus=8", "precision=bf16", "parallel=zero3")
    base += ("batch.global_size=128", "data.seq_len=2048", "model.activation_checkpointing=full")
    memory = _config(*base, "planner.objective=memory")
    sizes, steps = _fits_and_steps(memory)
    assert len(sizes) > 1
    by_memory = plan_config(memory)
    assert by_memory.layout.micro_size == max(sizes)
    assert "predicted speed" not in by_memory.micro_choice
    speed = _config(*base)  # planner.objective=speed is the default
    assert speed.planner.objective == Objective.speed
    by_speed = plan_config(speed)
    fastest = min(steps.values())
    assert by_speed.layout.micro_size == max(m for m in sizes if steps[m] <= fastest * (1 + SPEED_TIE))
    assert by_speed.knobs.spec.recompute == Recompute.full  # the configured recompute is kept
    why = by_speed.micro_choice
    assert "chosen for predicted speed (planner.objective=speed)" in why
    others = [m for m in sizes if m != by_speed.layout.micro_size]
    assert all(f"micro {m} {steps[m]:.3g} s" in why for m in others), why
    # The run chooses as its plan does, and says so in the same words.
    choice = layout_for_config(speed)
    assert choice.layout == by_speed.layout and choice.reason == why


def test_a_bad_objective_is_refused_naming_the_key_its_values_and_the_fix():
    config = _config()
    bad = dataclasses.replace(config, planner=dataclasses.replace(config.planner, objective="sped"))
    with pytest.raises(ConfigError) as refused:
        validate(bad, launcher=None)
    text = str(refused.value)
    assert "planner.objective=sped: must be one of speed, memory" in text
    assert text.endswith("; did you mean planner.objective=speed?")
