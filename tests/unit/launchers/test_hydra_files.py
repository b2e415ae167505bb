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


@pytest.fixture
def noted(monkeypatch):
    """hydra_files with no run or sweep directory noted yet (they are the process's)."""
    monkeypatch.setattr(hydra_files, "_NEW_RUN_DIRS", {})
    monkeypatch.setattr(hydra_files, "_NEW_SWEEP_DIRS", set())
    return hydra_files


def _as_hydra_writes_it(run_dir):
    """What Hydra leaves in a run directory before the task starts: .hydra/ and the job's log."""
    (run_dir / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run_dir / ".hydra" / name).write_text("{}\n")
    (run_dir / "train.log").write_text("")


def test_a_refused_run_leaves_no_directory_it_made(tmp_path, noted):
    """outputs/<date>/<time>/ of a day's first run: all three were this run's, and all three go."""
    run_dir = tmp_path / "outputs" / "2026-01-02" / "10-11-12"
    noted.note_new_run_dir(run_dir)
    _as_hydra_writes_it(run_dir)
    assert noted.remove_refused_run_dir(run_dir)
    assert list(tmp_path.iterdir()) == []


def test_a_refused_run_keeps_the_parents_that_were_there(tmp_path, noted):
    (tmp_path / "outputs" / "2026-01-02" / "09-00-00").mkdir(parents=True)  # an earlier run's
    run_dir = tmp_path / "outputs" / "2026-01-02" / "10-11-12"
    noted.note_new_run_dir(run_dir)
    _as_hydra_writes_it(run_dir)
    assert noted.remove_refused_run_dir(run_dir)
    assert [p.name for p in (tmp_path / "outputs" / "2026-01-02").iterdir()] == ["09-00-00"]


def test_a_directory_that_was_there_is_never_removed(tmp_path, noted):
    run_dir = tmp_path / "mine"
    run_dir.mkdir()  # the user's, before the run
    noted.note_new_run_dir(run_dir)
    _as_hydra_writes_it(run_dir)
    assert not noted.remove_refused_run_dir(run_dir)
    assert (run_dir / ".hydra" / "config.yaml").exists()


def test_a_new_directory_that_holds_anything_else_stays(tmp_path, noted):
    run_dir = tmp_path / "run"
    noted.note_new_run_dir(run_dir)
    _as_hydra_writes_it(run_dir)
    (run_dir / "notes.txt").write_text("written while it ran")
    assert not noted.remove_refused_run_dir(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]


def test_a_refused_cell_of_a_new_sweep_goes_with_the_sweep_when_it_is_the_only_one(tmp_path, noted):
    sweep = tmp_path / "multirun" / "12-00-00"
    noted.note_new_sweep_dir(sweep)
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}\n")
    _as_hydra_writes_it(sweep / "0")
    assert noted.remove_refused_run_dir(sweep / "0")
    assert noted.remove_refused_sweep_dir(sweep)
    assert not sweep.exists()


def test_a_sweep_whose_cells_ran_keeps_its_files(tmp_path, noted):
    sweep = tmp_path / "sweep"
    noted.note_new_sweep_dir(sweep)
    _as_hydra_writes_it(sweep / "0")
    (sweep / "0" / "summary.json").write_text("{}")
    (sweep / "multirun.yaml").write_text("{}\n")
    _as_hydra_writes_it(sweep / "1")
    assert noted.remove_refused_run_dir(sweep / "1")
    assert not noted.remove_refused_sweep_dir(sweep)
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "multirun.yaml"]
