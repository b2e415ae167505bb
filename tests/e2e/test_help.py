"""``python train.py --help`` as a user types it: each config group's options, every key with its
meaning, then the next commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ["model", "optimizer", "precision", "parallel", "data", "cluster", "logger"]


def _options(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_help_lists_each_groups_options_and_the_next_commands():
    """``python train.py --help``: every group's shipped options and nothing else beside them
    (the schemas are the root's, not options), then how to plan, sweep and compare."""
    root = CONF.parent
    command = [sys.executable, str(root / "train.py"), "--help"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=root, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for group in (*GROUPS, "experiment"):
        listed = next(line for line in lines if line.startswith(f"{group}: "))
        assert listed == f"{group}: {', '.join(_options(group))}"
    assert lines[0].startswith("ladder: ")
    for command in ("plan=true", "-m parallel=", "ladder report"):
        assert command in result.stdout
    # every key with its value and what it means, from runner/config.py
    # (tests/unit/launchers/test_help_text.py)
    headroom = next(line for line in lines if line.startswith("  planner.headroom = 0.9 "))
    assert "fraction of device and host memory" in headroom
