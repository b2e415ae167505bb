"""The command line's overrides are checked against the schema and conf/ before Hydra composes: a
misspelt key or option is refused with the closest valid ones, not with Hydra's advice to add it."""

from __future__ import annotations

import pytest

from launchers.overrides import closest_keys, command_overrides, group_options, override_problems

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["train.step=10"], "no key train.step; did you mean train.steps?"),
        (["+train.step=10"], "no key train.step (+ adds no key the schema lacks); did you mean train.steps?"),
        (["++train.step=10"], "did you mean train.steps?"),
        (["model.n_layers=3"], "no key model.n_layers; did you mean model.n_layer?"),
        (["steps=3"], "no key steps; did you mean train.steps?"),
        (["trian.steps=3"], "did you mean train.steps?"),
        (["parallel=zero4"], "no option parallel=zero4; did you mean zero3, zero2 or zero1?"),
        (["model=llama7b"], "did you mean llama_7b or llama_70b?"),
        (["experiment=gpt2"], "conf/experiment/ holds gpt2_124m_nanogpt"),
        (["-m", "parallel=zero1,zero9"], "no option parallel=zero9"),
        (["+train.steps=3"], "train.steps is a key already; drop the +"),
        (["gpus=two"], "gpus=two: must be a whole number"),
        (["train.steps=1.5"], "train.steps=1.5: must be a whole number"),
        (["optimizer.lr=fast"], "optimizer.lr=fast: must be a number"),
        (["parallel.allgather_bucket_size=5e8"], "write it out: parallel.allgather_bucket_size=500000000"),
        (["train.on_nonfinite=ignore"], "train.on_nonfinite=ignore: must be one of stop, skip"),
        (["train.on_nonfinite=skp"], "did you mean train.on_nonfinite=skip?"),
        (["-m", "gpus=1,two"], "gpus=two: must be a whole number"),
    ],
)
def test_a_bad_override_is_refused_with_the_closest_valid_one(argv, said):
    problems = override_problems(argv)
    assert len(problems) == 1, problems
    assert said in problems[0], problems[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["train.steps=10", "parallel=zero3", "gpus=2", "optimizer.lr=1e-3", "data.path=null"],
        ["++train.steps=3", "~model.n_kv_head", "experiment=gpt2_124m_nanogpt", "experiment=null"],
        ["-m", "parallel=ddp,zero1,zero3", "gpus=range(1,3)", "hydra/launcher=slurm"],
        ["-m", "parallel=glob(zero*)", "optimizer.lr=interval(1e-4,1e-2)"],
        ["hydra.run.dir=/tmp/x", "hydra.sweep.dir=/tmp/y", "hydra.job.chdir=false"],
        ["--cfg", "job", "plan=true", "train.steps=${seed}", "model={n_layer: 2}"],
        ["-sc", "install=bash"],
        ["--config-dir", "/somewhere", "parallel=mine"],  # another directory's options
    ],
)
def test_valid_overrides_sweeps_and_hydras_own_keys_pass(argv):
    assert override_problems(argv) == []


def test_a_run_or_sweep_directory_that_cannot_be_made_is_refused_before_hydra_makes_it(tmp_path):
    """Hydra would end in its own traceback; nothing is left behind by the check."""
    (tmp_path / "notes.txt").write_text("a user's file")
    under_file = tmp_path / "notes.txt" / "run"
    (problem,) = override_problems([f"hydra.run.dir={under_file}"])
    assert f"hydra.run.dir={under_file}: {tmp_path / 'notes.txt'} is a file" in problem
    assert "name a directory you can write" in problem
    (problem,) = override_problems(["-m", "hydra.sweep.dir=/proc/ladder/sweep", "gpus=1,2"])
    assert "hydra.sweep.dir=/proc/ladder/sweep: no directory can be made in /proc (" in problem
    assert override_problems([f"hydra.run.dir={tmp_path / 'new' / 'run'}"]) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


def test_a_group_lists_every_option_of_its_folder():
    groups = group_options()
    assert "experiment" in groups and "hydra" not in groups
    assert groups["parallel"][:2] == ["ddp", "pp2"]


def test_nearest_keys_prefer_siblings_then_any_section():
    assert closest_keys("train.step") == ["train.steps"]
    assert closest_keys("n_layer") == ["model.n_layer"]
    assert closest_keys("zzz") == []


def test_the_command_line_overrides_leave_hydras_flags_out():
    assert command_overrides(["--help", "-m", "gpus=2", "--cfg", "job"]) == ["gpus=2"]
