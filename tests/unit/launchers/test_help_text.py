"""``python train.py --help`` says, for every key, its value in the composed config and what it means
(the schema's own line, so the two cannot drift)."""

from __future__ import annotations

import pytest

from launchers.help import help_text
from runner.preflight.schema_keys import schema_keys

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def text() -> str:
    return help_text([])


def _line(text: str, path: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"  {path} = "))


def test_every_key_is_listed_with_its_value_and_meaning(text):
    for key in schema_keys():
        if key.is_section:
            assert f"{key.path}.*  {key.meaning}" in text
        else:
            assert _line(text, key.path).endswith(f"  {key.meaning}"), key.path


def test_the_keys_a_newcomer_asked_about_are_explained(text):
    assert _line(text, "planner.headroom").split()[:3] == ["planner.headroom", "=", "0.9"]
    assert "fraction of device and host memory" in _line(text, "planner.headroom")
    assert "ZeRO-3 keeps parameters" in _line(text, "parallel.param_persistence_threshold")
    assert "NaN or inf loss" in _line(text, "train.on_nonfinite")


def test_values_are_those_of_the_config_the_overrides_compose():
    text = help_text(["model=llama_7b", "train.steps=7"])
    assert _line(text, "model.n_layer").split()[2] == "32"
    assert _line(text, "train.steps").split()[2] == "7"


def test_a_sweep_shows_the_defaults_and_says_so():
    text = help_text(["gpus=1,2"])
    assert "(the defaults:" in text
    assert _line(text, "gpus").split()[2] == "1"
