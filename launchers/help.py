"""``python train.py --help``: the config groups' options, then every key with its value and meaning.

Hydra's own help prints the composed config as YAML, without a word on what a key does. Here
the same config is composed (with the command line's overrides, as Hydra's help composes
it), and each key is printed with its value and the one line runner/config.py gives it
beside its default, so the help cannot drift from the schema. The header and footer are
conf/config.yaml's ``hydra.help``; ``--hydra-help`` stays Hydra's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from launchers.compose import register_configs
from launchers.overrides import CONF, group_options
from runner.preflight.schema_keys import SchemaKey, schema_keys, spell

WIDEST = 50  # the meanings start one column after the widest ``key = value`` up to this


def _composed(overrides: list[str], conf: Path) -> tuple[DictConfig, str]:
    """The config as the command line composes it, and a note when its overrides could not be used."""
    register_configs()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="train"):
        try:
            return compose("config", overrides=overrides, return_hydra_config=True), ""
        except HydraException as error:  # a sweep (a=1,2) has no one value to show
            note = f"(the defaults: the overrides compose no one config: {str(error).splitlines()[0]})"
            return compose("config", return_hydra_config=True), note


def _value(cfg: DictConfig, key: SchemaKey) -> str:
    value = OmegaConf.select(cfg, key.path, throw_on_missing=False)
    return "???" if value == "???" else spell(value)


def _setting(cfg: DictConfig, key: SchemaKey) -> str:
    return f"  {key.path} = {_value(cfg, key)}"


def _groups_lines(conf: Path) -> list[str]:
    lines = ["== Configuration groups ==", "Compose your configuration from those groups (group=option)", ""]
    lines += [f"{group}: {', '.join(options)}" for group, options in group_options(conf).items()]
    return lines


def _keys_lines(cfg: DictConfig, note: str) -> list[str]:
    lines = [
        "== Keys ==",
        "Override any of them (key=value); each with its value in this config and its meaning",
    ]
    if note:
        lines.append(note)
    keys = schema_keys()
    width = min(WIDEST, max(len(_setting(cfg, key)) for key in keys))
    said = {key.path: f"{_setting(cfg, key).ljust(width)}  {key.meaning}" for key in keys}
    lines += ["", *(said[key.path] for key in keys if "." not in key.path and not key.is_section)]
    for section in (key for key in keys if key.is_section):
        lines += ["", f"{section.path}.*  {section.meaning}"]
        lines += [said[key.path] for key in keys if key.path.startswith(f"{section.path}.")]
    return lines


def help_text(overrides: list[str], conf: Path = CONF) -> str:
    """The whole of ``python train.py --help``."""
    cfg, note = _composed(overrides, conf)
    words: Any = cfg.hydra.help
    lines = [str(words.header).rstrip(), "", *_groups_lines(conf), "", *_keys_lines(cfg, note)]
    return "\n".join([*lines, "", str(words.footer).rstrip()])
