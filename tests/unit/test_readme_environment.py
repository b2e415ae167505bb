"""The README's first lines say how to use the environment ``make run`` made."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_first_lines_say_how_to_use_the_environment_make_run_made():
    first = "\n".join(README.read_text().splitlines()[:12])
    assert "make run" in first
    assert "source .venv/bin/activate" in first  # what turns the examples' `python` into .venv's
    assert "No module named 'hydra'" in first  # the error a plain python3 gives, named
