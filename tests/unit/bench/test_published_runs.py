"""bench/published_runs.py's case table: every case sourced, both halves there, ladder's keys."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from train_helpers import ROOT

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "bench" / "published_runs.py"
_spec = importlib.util.spec_from_file_location("published_runs", SCRIPT)
assert _spec is not None and _spec.loader is not None
published = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = published  # its dataclasses look their module up there
_spec.loader.exec_module(published)


def test_every_case_names_its_source_and_what_differs() -> None:
    """Each case's source is a listed repository, path and commit; each says what the plan leaves out."""
    for run in published.RUNS:
        assert run.source in published.SOURCES, run.label
        assert " @ " in published.SOURCES[run.source], run.source  # a commit, not a moving branch
        assert run.differs, run.label


def test_the_table_has_both_halves_and_at_least_15_cases() -> None:
    """At least 15 published runs, split into a tuning half and a held-out half, labels unique."""
    halves = {run.half for run in published.RUNS}
    assert halves == {"tuning", "held-out"}
    assert len(published.RUNS) >= 15
    assert len({run.label for run in published.RUNS}) == len(published.RUNS)


def test_the_cases_come_from_at_least_four_pages() -> None:
    """The cases read at least four published pages (repository and path), every source has a case."""
    used = {run.source for run in published.RUNS}
    assert used == set(published.SOURCES)
    pages = {tuple(published.SOURCES[key].split()[:2]) for key in used}
    assert len(pages) >= 4, pages


def test_mpt_keys_keep_its_parameter_count() -> None:
    """MPT-7B's shape as ladder's keys: SwiGLU of 8h/3 holds the 12 h^2 a block of GELU 4h holds."""
    keys = dict(o.split("=", 1) for o in published.mpt(4096, 32, 2048))
    h, ffn = int(keys["model.d_model"]), int(keys["model.ffn_hidden"])
    assert 3 * h * ffn == pytest.approx(8 * h * h, rel=1e-4)
    assert keys["model.vocab_size"] == "50368" and keys["model.tie_embeddings"] == "true"
