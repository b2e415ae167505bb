"""summary.json is strict JSON: what a browser, jq or the report reads without special cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.summary import read_summary, update_summary

pytestmark = pytest.mark.unit


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def test_non_finite_numbers_are_written_as_null(tmp_path: Path) -> None:
    update_summary(
        tmp_path,
        final={"loss": 2.5, "batch/noise_scale": float("nan")},
        history=[float("inf"), 1.0],
    )
    text = (tmp_path / "summary.json").read_text()
    data = json.loads(text, parse_constant=_refuse_constant)  # NaN / Infinity would raise here
    assert data["final"] == {"loss": 2.5, "batch/noise_scale": None}
    assert data["history"] == [None, 1.0]
    assert read_summary(tmp_path)["final"]["loss"] == 2.5
