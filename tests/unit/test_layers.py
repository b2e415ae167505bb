"""The code's layers hold as docs/architecture.md describes them: every package of runner/ has its
place in the import-linter contract, and every import deferred into a function says why."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "runner"


def _runner_layers() -> set[str]:
    """The names the runner contract's layers list, each layer split at ``|`` and ``:``."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the contract itself runs on any
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in settings["contracts"] if c.get("containers") == ["runner"])
    return {name.strip() for layer in contract["layers"] for name in re.split(r"[|:]", layer)}


def test_every_package_and_module_of_runner_sits_in_a_layer():
    """A new package or top-level module must be placed in the contract, or it is unchecked."""
    present = {p.name for p in RUNNER.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.stem for p in RUNNER.glob("*.py") if p.name != "__init__.py"}
    assert present - _runner_layers() == set(), "add these to [tool.importlinter]'s runner layers"


def test_runner_keeps_at_most_twelve_modules_at_its_top():
    """Concepts live in packages; the top holds the config, the batch contract, the estimator API."""
    top = sorted(p.name for p in RUNNER.glob("*.py"))
    assert len(top) <= 12, top


def _deferred_blocks(tree: ast.Module) -> list[tuple[int, int]]:
    """(first line, last line) of each run of import statements inside a function or class
    body, or under a statement other than ``if TYPE_CHECKING``."""
    blocks = []
    for node in ast.walk(tree):
        if node is tree or (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            continue
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            run: list[ast.stmt] = []
            for statement in [*body, None]:
                if isinstance(statement, ast.Import | ast.ImportFrom):
                    run.append(statement)
                    continue
                if run:
                    blocks.append((run[0].lineno, run[-1].end_lineno or run[-1].lineno))
                run = []
    return blocks


def test_every_deferred_import_says_why_it_is_deferred():
    """An import inside a function carries a comment with its reason (start-up time, a dependency
    only some runs need): never a hidden import cycle, which import-linter would then miss."""
    silent = []
    for path in sorted([*RUNNER.rglob("*.py"), *(ROOT / "launchers").rglob("*.py")]):
        lines = path.read_text().splitlines()
        for first, last in _deferred_blocks(ast.parse("\n".join(lines))):
            above = lines[first - 2].strip() if first > 1 else ""
            if not above.startswith("#") and not any("#" in lines[n - 1] for n in range(first, last + 1)):
                silent.append(f"{path.relative_to(ROOT)}:{first}")
    assert silent == [], "deferred imports without a comment saying why"
