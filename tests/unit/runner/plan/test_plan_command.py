"""The recommended command plans what was planned: every model key and workload key it used."""

from __future__ import annotations

import shlex

import pytest
from train_helpers import ROOT, compose_config

from runner.plan.ladder import recommend
from runner.plan.planner import plan_config

pytestmark = pytest.mark.unit

QWEN = ROOT / "conf" / "model" / "hf_configs" / "qwen2_5_7b.json"
MODEL_OPTIONS = {p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")}
BASE = ("cluster=h100_sxm", "gpus=64", "precision=bf16", "parallel=zero3")


def _recommended(*overrides: str) -> tuple[list[str], object]:
    """The winner's overrides for this config, and the config they compose to."""
    config = compose_config(*BASE, *overrides)
    ladder = recommend(plan_config(config).workload)
    assert ladder.winner is not None
    words = shlex.split(ladder.command)[2:]  # after "python train.py"
    assert words == ladder.overrides
    return words, config


@pytest.mark.parametrize(
    "overrides",
    [
        # Llama 3 8B typed by hand over another preset: the seven keys the user typed
        (
            "model=llama_7b",
            "model.n_kv_head=8",
            "model.ffn_hidden=14336",
            "model.vocab_size=128256",
            "model.max_seq_len=8192",
            "model.rope_theta=500000.0",
            "model.norm_eps=1e-05",
            "model.name=llama3_by_hand",
        ),
        ("model=hf", f"model.hf_config={QWEN}", "model.max_seq_len=4096"),
        ("model=qwen2_5_7b", "train.eval_every=100", "planner.headroom=0.8", "train.checkpoint_every=50"),
    ],
    ids=["by-hand", "hf-config", "preset"],
)
def test_the_recommended_command_composes_to_the_planned_model_and_workload(overrides):
    words, config = _recommended(*overrides)
    model_words = [w for w in words if w.startswith("model=")]
    assert len(model_words) == 1 and model_words[0].removeprefix("model=") in MODEL_OPTIONS
    again = compose_config(*words)
    assert again.model == config.model
    first, second = plan_config(config).workload, plan_config(again).workload
    assert first.num_params == second.num_params
    assert (first.headroom, first.eval_every, first.checkpoint_every) == (
        second.headroom,
        second.eval_every,
        second.checkpoint_every,
    )


def test_a_preset_as_shipped_is_named_alone():
    words, _ = _recommended("model=llama3_8b")
    assert [w for w in words if w.startswith("model")] == ["model=llama3_8b"]
