"""The command-line overrides that give a plan's workload back: its model and the run's other keys.

A recommended command (runner/plan/ladder.py) must plan what was planned. The model is named by
its conf/model option and every ``model.*`` key whose value is not that option's (a key set by
hand, by an experiment, or read from ``model.hf_config``); a model whose name is no option of
conf/model is written over the group's default option. The workload's other keys (the planner's
headroom, compilation, evaluation, checkpoints, the filesystem's speed) follow when they are
not the schema's defaults.
"""

from __future__ import annotations

import dataclasses
import re
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from runner.config import ModelConfig, PlannerConfig, TrainLoopConfig
from runner.model.hf_config import resolve_hf_model
from runner.step_time.workload import Workload

CONF = Path(__file__).resolve().parents[2] / "conf"
MODEL_GROUP = CONF / "model"
# Keys a plan's knobs set in the command of their own (runner/plan/ladder.py overrides_for).
KNOB_KEYS = frozenset({"activation_checkpointing"})


def hydra_value(value: Any) -> str:
    """``value`` as a Hydra override writes it: true/false, null, enums by value, odd strings quoted."""
    if isinstance(value, Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and not re.fullmatch(r"[\w./~+-]+", value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def default_model_option() -> str:
    """The conf/model option conf/config.yaml's defaults list picks."""
    root = yaml.safe_load((CONF / "config.yaml").read_text())
    return next(entry["model"] for entry in root["defaults"] if isinstance(entry, dict) and "model" in entry)


def model_option(name: str) -> ModelConfig | None:
    """conf/model/<name>.yaml as the ModelConfig it composes to (None: no such option)."""
    path = MODEL_GROUP / f"{name}.yaml"
    if not path.is_file():
        return None
    return ModelConfig(**(yaml.safe_load(path.read_text()) or {}))


def model_overrides(model: ModelConfig) -> list[str]:
    """``model=<option>`` and each ``model.<key>=<value>`` that makes the option into ``model``."""
    option = model.name
    preset = model_option(option)
    if preset is None:
        option = "hf" if model.hf_config is not None else default_model_option()
        preset = model_option(option) or ModelConfig()
    # The file's shape, as the launch layer reads it (launchers/compose.py): written as its path.
    expected = resolve_hf_model(dataclasses.replace(preset, hf_config=model.hf_config))
    keys = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in KNOB_KEYS]
    changed = [key for key in keys if getattr(model, key) != getattr(expected, key)]
    if model.hf_config is not None and model.hf_config != preset.hf_config:
        changed = ["hf_config", *(key for key in changed if key != "hf_config")]
    return [f"model={option}", *(f"model.{key}={hydra_value(getattr(model, key))}" for key in changed)]


def workload_overrides(w: Workload) -> list[str]:
    """The overrides of the workload's keys other than the model's, cluster's, batch's and layout's."""
    loop, planner = TrainLoopConfig(), PlannerConfig()
    out = []
    if w.headroom != planner.headroom:
        out.append(f"planner.headroom={w.headroom}")
    if w.compiled:
        out.append("train.compile=true")
    if w.eval_every != loop.eval_every:
        out += [f"train.eval_every={w.eval_every}", f"train.eval_batches={w.eval_batches}"]
    if w.checkpoint_every != loop.checkpoint_every:
        out.append(f"train.checkpoint_every={w.checkpoint_every}")
    if w.storage_bytes_per_s is not None:
        out.append(f"cluster.storage_gb_per_s={w.storage_bytes_per_s / 1e9:g}")
    return out


__all__ = ["hydra_value", "model_overrides", "workload_overrides"]
