"""A JSON file read, whether a JSON value has a Python type, and the type in a reader's words: what
summary.json's and plan.json's schemas (runner/rundir/summary.py, runner/rundir/plan_record.py)
read their files through.

A hint is what a dataclass field is annotated with: ``int``, ``float``, ``str``, ``bool``, an
enum (a JSON value of its values), ``X | None``, ``list[X]``, ``dict[str, X]``, a TypedDict (a JSON
object, its keys unchecked) or ``Any``.
"""

from __future__ import annotations

import json
import types
from enum import Enum
from pathlib import Path
from typing import Any, TypeAlias, Union, get_args, get_origin, is_typeddict

# Any JSON value, and a JSON object: for a dict whose keys are another program's (DeepSpeed's
# config, a Hugging Face config.json), written or passed on whole rather than read key by key.
Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None
JsonObject: TypeAlias = dict[str, Json]


def holds(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the type ``hint``."""
    if hint is Any:
        return True
    if is_typeddict(hint):  # a record whose keys its writer names: a JSON object
        return isinstance(value, dict)
    if isinstance(hint, type) and issubclass(hint, Enum):  # a value of the enum's, as JSON holds it
        return not isinstance(value, bool) and value in {member.value for member in hint}
    if get_origin(hint) in (Union, types.UnionType):
        return any(holds(value, arg) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    if isinstance(value, bool):  # JSON's true is no number
        return hint is bool
    if hint is float:
        return isinstance(value, int | float)  # JSON writes 2.0 as 2 in some hands
    origin = get_origin(hint)
    if origin is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(holds(v, item) for v in value)
    if origin is dict:
        _, item = get_args(hint) or (str, Any)
        return isinstance(value, dict) and all(holds(v, item) for v in value.values())
    return isinstance(value, hint)


def type_words(hint: Any) -> str:
    """The type ``hint`` in a reader's words: "an integer or null", "a list of strings"."""
    if isinstance(hint, type) and issubclass(hint, Enum):
        return f"one of {', '.join(str(member.value) for member in hint)}"
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}
    if get_origin(hint) in (Union, types.UnionType):
        return " or ".join(type_words(arg) for arg in get_args(hint))
    if get_origin(hint) is list:
        (item,) = get_args(hint)
        return f"a list of {type_words(item).split(' ', 1)[-1]}s"
    if get_origin(hint) is dict or is_typeddict(hint):
        return "a JSON object"
    return names.get(hint, str(hint))


def read_json(path: Path, error: type[ValueError], fix: str) -> Any:
    """``path``'s JSON; FileNotFoundError where there is no file, ``error`` naming the file and
    ``fix`` where it holds no JSON."""
    text = path.read_text()
    try:
        return json.loads(text)
    except ValueError as cause:
        raise error(f"{path}: not JSON ({cause}); {fix}") from cause


__all__ = ["Json", "JsonObject", "holds", "read_json", "type_words"]
