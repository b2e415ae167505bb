"""Every key of the schema says what it means and which values it takes, and a value outside them is
refused before launch with the key, the value and the fix (runner/preflight/validate.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from train_helpers import ROOT

from launchers.compose import register_configs, to_train_config
from runner.config import (
    ClusterConfig,
    DataConfig,
    LoggerConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
)
from runner.errors import ConfigError
from runner.key_metadata import Range
from runner.preflight.schema_keys import SchemaKey, schema_keys, spell
from runner.preflight.validate import range_problems, validate

pytestmark = pytest.mark.unit

CONF = ROOT / "conf"
LEAVES = [key for key in schema_keys() if not key.is_section]
NUMBERS = [key for key in LEAVES if key.kind in (int, float)]
ENUMS = [key for key in LEAVES if key.is_enum]


def _default_config() -> TrainConfig:
    return TrainConfig(
        model=ModelConfig(),
        optimizer=OptimizerConfig(),
        precision=PrecisionConfig(),
        parallel=ParallelConfig(),
        data=DataConfig(),
        cluster=ClusterConfig(),
        logger=LoggerConfig(),
    )


def _with(config, path: str, value):
    """``config`` with the key at ``path`` set to ``value`` (no check: the point is to pass bad ones)."""
    head, _, rest = path.partition(".")
    inner = value if not rest else _with(getattr(config, head), rest, value)
    return dataclasses.replace(config, **{head: inner})


def _outside(key: SchemaKey):
    """A value just outside the key's range, of the key's type."""
    valid = key.valid
    assert valid is not None
    if valid.low is not None:
        value = valid.low if valid.low_open else valid.low - 1
    else:
        assert valid.high is not None
        value = valid.high if valid.high_open else valid.high + 1
    return key.kind(value)


def test_every_key_says_what_it_means():
    """--help prints this line for every key (launchers/help.py): none may be missing."""
    missing = [key.path for key in schema_keys() if not key.meaning.strip()]
    assert missing == []
    assert len(LEAVES) > 80  # the walk reached into every section


def test_every_number_has_its_range_in_the_schema():
    """One place for every range: runner/config.py's field metadata, read by validate."""
    assert [key.path for key in NUMBERS if key.valid is None] == []
    assert ENUMS and NUMBERS


def test_the_defaults_lie_in_their_ranges():
    assert range_problems(_default_config()) == []
    for key in NUMBERS:
        assert key.default is None or key.valid.holds(key.default), key.path


@pytest.mark.parametrize("key", NUMBERS + ENUMS, ids=lambda key: key.path)
def test_a_value_outside_its_range_is_refused_naming_key_value_and_fix(key):
    bad = f"not_a_{key.name}" if key.is_enum else _outside(key)
    with pytest.raises(ConfigError) as refused:
        validate(_with(_default_config(), key.path, bad), launcher=None)
    lines = str(refused.value).splitlines()
    assert lines == [f"  - {lines[0].removeprefix('  - ')}"], "one mistake, one line"
    assert lines[0].startswith(f"  - {key.path}={spell(bad)}: must be "), lines[0]
    if key.is_enum:
        assert all(str(member.value) in lines[0] for member in key.kind)
    else:
        assert f"e.g. {key.path}=" in lines[0] and key.meaning in lines[0]


def test_the_range_words_name_the_bounds():
    assert Range(low=1).words() == "at least 1"
    assert Range(low=0).words() == "0 or more"
    assert Range(low=0, low_open=True).words() == "positive"
    assert Range(low=0, high=1, low_open=True).words() == "in (0, 1]"
    assert Range(low=0, high=1, high_open=True).words() == "in [0, 1)"
    assert not Range(low=0, high=1, high_open=True).holds(1.0)
    assert Range(low=0, high=1, high_open=True).holds(0.0)


def test_a_negative_weight_decay_is_refused_before_torch_sees_it():
    """optimizer.weight_decay=-1 used to reach torch.optim.AdamW's ValueError in rank 0."""
    with pytest.raises(ConfigError, match=r"optimizer.weight_decay=-1: must be 0 or more"):
        validate(_with(_default_config(), "optimizer.weight_decay", -1.0), launcher=None)


def _options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


SHIPPED = [(g, o) for g in ("model", "optimizer", "parallel", "cluster", "experiment") for o in _options(g)]


@pytest.mark.parametrize(("group", "option"), SHIPPED)
def test_every_shipped_option_lies_in_the_ranges(group, option):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = to_train_config(compose(config_name="config", overrides=[f"{group}={option}"]))
    assert range_problems(config) == []
