"""Every key of the root schema (runner/config.py), with its type, default, meaning and range.

One walk of the frozen dataclasses serves three readers: ``python train.py --help``
(launchers/help.py), the command line's check for unknown keys and bad values
(launchers/overrides.py), and the range check before launch (runner/preflight/validate.py).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from runner.config import MISSING, TrainConfig
from runner.key_metadata import HELP, RANGE, Range


@dataclass(frozen=True)
class SchemaKey:
    """One key: ``train.steps``, its owner's field, and what the schema says of it."""

    path: str  # dotted, from the root: train.steps
    owner: type  # the dataclass that holds it: TrainLoopConfig
    name: str  # its field there: steps
    kind: Any  # int, float, bool, str, an Enum class, or a schema dataclass (a section)
    optional: bool  # null is allowed
    default: Any  # the schema's default; MISSING for a section a config group fills
    meaning: str  # one line, for --help and refusals
    valid: Range | None  # a number's range (None: any value of its type)

    @property
    def is_section(self) -> bool:
        """A key that holds other keys (model, train, ...)."""
        return dataclasses.is_dataclass(self.kind)

    @property
    def is_enum(self) -> bool:
        """A key whose values are a closed set (an Enum of runner/config_choices.py)."""
        return isinstance(self.kind, type) and issubclass(self.kind, Enum)

    def example(self) -> str:
        """The schema's default as a command line spells it: ``train.steps=60``."""
        return f"{self.path}={spell(self.default)}"


def spell(value: Any) -> str:
    """A value as the command line and YAML spell it: ``null``, ``true``, ``3e-08``, ``zero3``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """``int | None`` -> (int, True); ``int`` -> (int, False)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return MISSING


def _walk(schema: type, prefix: str) -> list[SchemaKey]:
    hints = typing.get_type_hints(schema)
    found = []
    for field in dataclasses.fields(schema):
        kind, optional = _unwrap(hints[field.name])
        key = SchemaKey(
            path=f"{prefix}{field.name}",
            owner=schema,
            name=field.name,
            kind=kind,
            optional=optional,
            default=_default(field),
            meaning=str(field.metadata.get(HELP, "")),
            valid=field.metadata.get(RANGE),
        )
        found.append(key)
        if key.is_section:
            found += _walk(kind, f"{key.path}.")
    return found


@functools.cache
def schema_keys() -> tuple[SchemaKey, ...]:
    """Every key of TrainConfig, depth first, each section before the keys it holds."""
    return tuple(_walk(TrainConfig, ""))


@functools.cache
def keys_by_path() -> dict[str, SchemaKey]:
    """schema_keys() by dotted path."""
    return {key.path: key for key in schema_keys()}


def value_at(config: Any, path: str) -> Any:
    """The value of ``path`` (``train.steps``) in a TrainConfig."""
    return functools.reduce(getattr, path.split("."), config)
