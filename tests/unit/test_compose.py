"""Every shipped config composes into the typed root config; bad overrides fail with the key."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from runner.config import Precision, TrainConfig, register_configs, to_train_config

pytestmark = pytest.mark.unit

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ["model", "optimizer", "precision", "parallel", "data", "cluster", "logger"]


def _options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes(group, option):
    config = to_train_config(_compose([f"{group}={option}"]))
    assert isinstance(config, TrainConfig)
    assert getattr(config, group).name == option or getattr(config, group).name.value == option


def test_typed_config_is_frozen():
    config = to_train_config(_compose(["precision=bf16", "gpus=2"]))
    assert config.precision.name == Precision.bf16
    with pytest.raises(AttributeError):
        config.gpus = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("model.n_layr=3", "n_layr"),
        ("gpus=two", "gpus"),
        ("precision.name=fp8", "fp8"),
        ("parallel=zero4", "zero4"),
    ],
)
def test_bad_overrides_fail_at_composition(override, fragment):
    with pytest.raises((ConfigCompositionException, ValueError)) as info:
        to_train_config(_compose([override]))
    text = f"{info.value} {info.value.__cause__}"
    assert fragment in text


def test_help_lists_each_groups_options_and_the_next_commands():
    """``python train.py --help``: every group's shipped options and nothing else beside them
    (the schemas are the root's, not options), then how to plan, sweep and compare."""
    root = CONF.parent
    command = [sys.executable, str(root / "train.py"), "--help"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=root, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for group in GROUPS:
        listed = next(line for line in lines if line.startswith(f"{group}: "))
        assert listed == f"{group}: {', '.join(_options(group))}"
    assert lines[0].startswith("ladder: ")
    for command in ("plan=true", "-m parallel=", "ladder report"):
        assert command in result.stdout
