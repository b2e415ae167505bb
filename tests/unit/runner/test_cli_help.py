"""``ladder --help`` names every subcommand's job, not only the report's."""

from __future__ import annotations

import pytest

from runner.cli import build_parser

pytestmark = pytest.mark.unit


def test_the_description_names_what_each_subcommand_does():
    parser = build_parser()
    text = parser.format_help()
    assert "Review ladder runs and sweeps." not in text
    for word in ("compare runs and sweeps", "export a run as a Hugging Face model", "tokenize text"):
        assert word in " ".join(text.split()), text
    assert {"report", "export", "tokenize"} <= set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
