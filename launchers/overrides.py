"""The command line's overrides against the schema and conf/'s options, before Hydra composes.

Hydra answers ``train.step=10`` with "To append to your config use +train.step=10", and that
advice ends in a traceback (the frozen TrainLoopConfig has no field ``step``); it answers
``parallel=zero4`` with the options but no suggestion. Here every override of ``sys.argv``
is parsed with Hydra's own grammar and checked first: a key the schema lacks (with or
without ``+``), an option no conf/<group>/ holds, and a value its key's type cannot take,
each with the closest valid keys or options (difflib). Ranges are not checked here: the
composed config's are, once, in runner/preflight/validate.py.

Hydra's own keys (``hydra.*``, ``hydra/launcher=...``) are Hydra's to check, but for a run or
sweep directory that cannot be made (launchers/output_dirs.py). With another
config directory (``--config-dir``, ``--config-path``, ``hydra.searchpath``) a group may hold
options conf/ does not, and only keys are checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, QuotedString, ValueType
from hydra.errors import HydraException
from omegaconf.errors import ValidationError

from launchers.compose import unlocked_node
from launchers.output_dirs import OUTPUT_DIR_KEYS, directory_problem
from runner.preflight.schema_keys import SchemaKey, keys_by_path, spell
from runner.preflight.validate import value_problem

CONF = Path(__file__).resolve().parents[1] / "conf"

# How a refusal names the values of a key's type.
TYPE_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}


def group_options(conf: Path = CONF) -> dict[str, list[str]]:
    """Each config group under ``conf`` (not Hydra's own) and its options, sorted."""
    return {
        folder.name: sorted(path.stem for path in folder.glob("*.yaml"))
        for folder in sorted(conf.iterdir())
        if folder.is_dir() and folder.name != "hydra"
    }


def _closest(word: str, candidates: list[str]) -> list[str]:
    """Up to three of ``candidates`` like ``word``: those about as like it as the likest (difflib)."""
    scored = sorted(((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in candidates), reverse=True)
    if not scored or scored[0][0] < 0.6:
        return []
    return [c for score, c in scored[:3] if score >= max(0.6, scored[0][0] - 0.1)]


def _did_you_mean(names: list[str]) -> str:
    if not names:
        return ""
    said = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"; did you mean {said}?"


def closest_keys(path: str) -> list[str]:
    """The schema's keys nearest ``path``: its siblings first, then any key, then a key of the same
    name under another section (``steps`` -> ``train.steps``)."""
    paths = list(keys_by_path())
    parent, _, leaf = path.rpartition(".")
    siblings = [p for p in paths if p.rpartition(".")[0] == parent]
    leaves = {p.rpartition(".")[2] for p in paths}
    found = _closest(path, siblings) or _closest(path, paths)
    if not found:  # a key of another section: steps -> train.steps
        near_leaves = difflib.get_close_matches(leaf, leaves, n=3, cutoff=0.8)
        found = [p for p in paths if p.rpartition(".")[2] in near_leaves]
    return found[:3]


def _elements(override: Override) -> Iterator[Any]:
    """The values an override sets, one per cell of a sweep; none for what is drawn at run time."""
    if override.is_delete() or override.value_type is None:
        return
    if override.value_type in (ValueType.GLOB_CHOICE_SWEEP, ValueType.INTERVAL_SWEEP):
        return  # matched against the options, or drawn by the sweeper
    values = override.sweep_iterator() if override.is_sweep_override() else [override.value()]
    for value in values:
        yield value.text if isinstance(value, QuotedString) else value


def _type_problem(key: SchemaKey, value: Any) -> str | None:
    """Why ``key`` cannot hold ``value`` (as OmegaConf converts it during composition), or None."""
    if isinstance(value, str) and "${" in value:
        return None  # an interpolation: resolved, and checked, once composed
    node = unlocked_node(key.owner)
    try:
        node[key.name] = value
    except ValidationError:
        if key.is_enum:
            return value_problem(key, value)
        null = " or null" if key.optional else ""
        words = TYPE_WORDS.get(key.kind, key.kind.__name__)
        if key.kind is int and isinstance(value, float) and value.is_integer():
            # 1e9, as DeepSpeed's docs spell its sizes, is a float to Hydra's grammar.
            return (
                f"{key.path}={spell(value)}: must be {words}{null}, and Hydra reads 1e9-style numbers "
                f"as floats; write it out: {key.path}={int(value)} ({key.meaning})"
            )
        return f"{key.path}={spell(value)}: must be {words}{null} ({key.meaning}); e.g. {key.example()}"
    return None


def key_problems(override: Override) -> list[str]:
    """An override of a config key: one the schema lacks, one ``+`` would add twice, a bad value."""
    path = override.key_or_group
    key = keys_by_path().get(path)
    if key is None:
        plus = " (+ adds no key the schema lacks)" if override.is_add() or override.is_force_add() else ""
        return [f"no key {path}{plus}{_did_you_mean(closest_keys(path))} (python train.py --help lists them)"]
    if override.is_add():
        return [f"{override.input_line}: {path} is a key already; drop the +: {path}=..."]
    if key.is_section:
        return []  # a dict merged into a section: its keys are OmegaConf's to check
    return [problem for value in _elements(override) if (problem := _type_problem(key, value)) is not None]


def option_problems(override: Override, options: list[str]) -> list[str]:
    """An override of a config group: each option it names that the group's folder lacks."""
    group = override.key_or_group
    problems = []
    for option in _elements(override):
        if option is None or not isinstance(option, str) or option in options:
            continue  # null deselects the group (experiment=null)
        problems.append(
            f"no option {group}={option}{_did_you_mean(_closest(option, options))} "
            f"(conf/{group}/ holds {', '.join(options)})"
        )
    return problems


def _elsewhere(args: Any, overrides: list[Override]) -> bool:
    """Whether groups may hold options from a config directory other than conf/."""
    searched = any(o.key_or_group == "hydra.searchpath" for o in overrides)
    return searched or any((args.config_dir, args.config_path, args.config_name))


def command_overrides(argv: list[str]) -> list[str]:
    """The overrides of a command line (``argv`` less the program), without Hydra's flags."""
    args, _ = get_args_parser().parse_known_args(argv)
    return list(args.overrides)


def override_problems(argv: list[str], conf: Path = CONF) -> list[str]:
    """Every problem of ``argv``'s overrides (train.py's command line less the program), one line each."""
    # hydra.main's own parser (hydra/_internal/utils.py): flags (-m, --cfg job) read as Hydra reads them.
    args, _ = get_args_parser().parse_known_args(argv)
    if args.shell_completion or args.experimental_rerun:
        return []  # not overrides of this config: Hydra's completion, a pickled config
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except HydraException:
        return []  # the grammar's own error, which Hydra words when it parses them again
    groups = group_options(conf)
    elsewhere = _elsewhere(args, overrides)
    problems: list[str] = []
    for override in overrides:
        name = override.key_or_group
        if name in OUTPUT_DIR_KEYS and isinstance(override.value(), str):
            problems += filter(None, [directory_problem(name, str(override.value()))])
        if override.is_hydra_override() or "/" in name or override.package is not None:
            continue  # Hydra's own, or a group of groups or a package that conf/ does not use
        if name in groups and not elsewhere:
            problems += option_problems(override, groups[name])
        elif name not in groups:
            problems += key_problems(override)
    return problems
