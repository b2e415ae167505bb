"""A refused resume puts the run's .hydra/ files back; an attempt that runs keeps its own."""

from __future__ import annotations

import pytest

from launchers import hydra_files

pytestmark = pytest.mark.unit


def _hydra_dir(tmp_path):
    hydra = tmp_path / ".hydra"
    hydra.mkdir()
    (hydra / "config.yaml").write_text("batch:\n  global_size: 16\n")
    (hydra / "overrides.yaml").write_text("- train.steps=8\n")
    return hydra


def test_a_refused_attempt_leaves_the_files_as_they_were(tmp_path):
    hydra = _hydra_dir(tmp_path)
    before = {p.name: p.read_text() for p in hydra.glob("*.yaml")}
    hydra_files.set_aside(tmp_path)
    # Hydra writes the refused attempt's files over them (and one the run did not have).
    (hydra / "config.yaml").write_text("batch:\n  global_size: 32\n")
    (hydra / "hydra.yaml").write_text("hydra: {}\n")
    assert hydra_files.put_back(tmp_path)
    assert {p.name: p.read_text() for p in hydra.glob("*.yaml")} == before
    assert {p.name for p in hydra.iterdir()} == set(before)  # and no copy left behind


def test_an_attempt_that_runs_keeps_its_own_files_and_no_copy(tmp_path):
    hydra = _hydra_dir(tmp_path)
    hydra_files.set_aside(tmp_path)
    (hydra / "config.yaml").write_text("batch:\n  global_size: 16\ntrain:\n  steps: 12\n")
    hydra_files.drop_copy(tmp_path)
    assert "steps: 12" in (hydra / "config.yaml").read_text()
    assert {p.name for p in hydra.iterdir()} == {"config.yaml", "overrides.yaml"}


def test_a_new_directory_has_nothing_to_put_back(tmp_path):
    hydra_files.set_aside(tmp_path)
    assert not hydra_files.put_back(tmp_path)
    assert not (tmp_path / ".hydra").exists()
