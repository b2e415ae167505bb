"""Every test module carries exactly one tier marker, at module level, and pytest knows each tier.

`pytest -m <tier>` selects by these markers: a module with no tier runs in no tier's selection, one
with two runs in both. The modules are read with ``ast``, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
TIERS = {"unit", "e2e", "multirank", "slurm", "multinode", "browser", "gpu"}


def _marker_name(node: ast.AST) -> str | None:
    """``pytest.mark.<name>`` or ``pytest.mark.<name>(...)``: the name; anything else: None."""
    if isinstance(node, ast.Call):
        node = node.func
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "pytest"
    ):
        return node.attr
    return None


def _module_tiers(tree: ast.Module) -> list[str]:
    """The tier markers of the module's ``pytestmark = ...`` (one marker, or a list or tuple of them)."""
    tiers: list[str] = []
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            continue
        marks = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
        tiers += [name for name in map(_marker_name, marks) if name in TIERS]
    return tiers


def _all_tier_uses(tree: ast.Module) -> list[str]:
    """Every ``pytest.mark.<tier>`` anywhere in the module: decorators and ``pytest.param`` included."""
    return [name for node in ast.walk(tree) if (name := _marker_name(node)) in TIERS]


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_module_carries_exactly_one_tier_at_module_level():
    modules = _test_modules()
    assert len(modules) > 50, modules  # the walk found the suite
    wrong = []
    for path in modules:
        tree = ast.parse(path.read_text(), filename=str(path))
        tiers, used = _module_tiers(tree), _all_tier_uses(tree)
        if len(tiers) != 1 or len(used) != 1:
            # len(used) > 1: a test or parameter marked with a tier of its own, on top of its module's
            wrong.append(f"{path.relative_to(ROOT)}: module tiers {tiers}, tier markers anywhere {used}")
    assert not wrong, (
        f"each test module needs exactly one `pytestmark = pytest.mark.<tier>` (tiers: {sorted(TIERS)}) "
        "and no tier marker on its tests:\n  " + "\n  ".join(wrong)
    )


def test_pytest_registers_every_tier(pytestconfig):
    """pyproject.toml's [tool.pytest.ini_options] markers: --strict-markers refuses a tier not there."""
    registered = {line.split(":", 1)[0].strip() for line in pytestconfig.getini("markers")}
    missing = TIERS - registered
    assert not missing, f"tiers not registered in pyproject.toml: {sorted(missing)}"
