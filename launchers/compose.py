"""Hydra's side of the typed config: the schemas in Hydra's ConfigStore, and one conversion.

runner/config.py holds the schemas as plain frozen dataclasses. Here, in the launch layer,
they are registered for composition, and a composed ``DictConfig`` becomes the frozen
:class:`~runner.config.TrainConfig` once; ranks receive that object, never a ``DictConfig``.

The classes are ``frozen=True``. Hydra must still merge overrides onto them while it
composes, so the node stored in the ConfigStore is an unlocked copy
(:func:`unlocked_node`); ``OmegaConf.to_object`` then builds the frozen instances.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.config import TrainConfig
from runner.model.hf_config import resolve_hf_model
from runner.rundir.run_files import HYDRA_CONFIG_FILE, HYDRA_DIR


def _unlock(node: Any) -> None:
    """Clear the read-only flag that frozen dataclasses put on every node."""
    node._set_flag("readonly", False)
    if isinstance(node, DictConfig):
        for key in node:
            _unlock(node._get_node(key))


def unlocked_node(schema: type) -> DictConfig:
    """A structured node of ``schema`` that Hydra may merge overrides into."""
    node = OmegaConf.structured(schema)
    _unlock(node)
    return node


def register_configs() -> None:
    """Register the root schema in Hydra's ConfigStore.

    conf/config.yaml puts it first in its defaults, so each group's YAML merges into its
    typed field (``parallel: ParallelConfig`` and so on): a key the schema lacks or a value
    of the wrong type fails at composition with its path, and what a YAML leaves out takes
    the schema's default. The groups list only their options (no schema beside them).
    """
    # Deferred: hydra's ConfigStore is needed only where a config is composed, not where one is read.
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=unlocked_node(TrainConfig))


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """Convert a composed Hydra config into the frozen typed root config.

    A ``model.hf_config`` file is read here, once (runner/model/hf_config.py): every consumer
    (the plan, the ledger, the ranks, a recommended command) sees the model's whole shape.
    A file it cannot read or map raises ConfigError, refused before launch. A held-out set given
    without an interval gets one (:func:`held_out_evaluated`).
    """
    config = OmegaConf.to_object(cfg)
    if not isinstance(config, TrainConfig):
        raise TypeError(f"expected a TrainConfig, got {type(config).__name__}")
    return held_out_evaluated(dataclasses.replace(config, model=resolve_hf_model(config.model)))


# A held-out set given without train.eval_every is evaluated this many times in the run, the last
# after its last step: a curve of the held-out loss, where an unset key would silently leave the
# set unused. The plan prices the evaluations as it prices any train.eval_every.
HELD_OUT_EVALUATIONS = 5


def held_out_evaluated(config: TrainConfig) -> TrainConfig:
    """``config`` with ``train.eval_every`` set where ``data.val_path`` is given and it is 0: every
    ``train.steps / HELD_OUT_EVALUATIONS`` steps (at least 1)."""
    train = config.train
    if config.data.val_path is None or train.eval_every > 0:
        return config
    every = max(1, train.steps // HELD_OUT_EVALUATIONS)
    return dataclasses.replace(config, train=dataclasses.replace(train, eval_every=every))


def load_config(run_dir: Path) -> TrainConfig:
    """The typed config of a prepared run directory, from the composed config Hydra saved
    (``.hydra/config.yaml``): for tools that read a run afterwards (bench/bare_loop.py)."""
    composed = OmegaConf.load(run_dir / HYDRA_DIR / HYDRA_CONFIG_FILE)
    node = OmegaConf.merge(unlocked_node(TrainConfig), composed)
    assert isinstance(node, DictConfig)
    return to_train_config(node)
