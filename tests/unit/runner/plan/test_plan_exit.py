"""plan=true's verdict is its exit status: 0 it fits and holds the batch contract, 3 it does not fit,
4 it holds the contract only at another global batch; a sweep of plans exits with its worst. A plan
for a named cluster does not weigh this host's disk as the cluster's."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
from train_helpers import compose_config, plan_json

from launchers import plan_exit
from launchers.plan_job import plan_job
from runner.checkpoint import size as checkpoint_size
from runner.exit_codes import ExitCode

pytestmark = pytest.mark.unit

Usage = namedtuple("Usage", "total used free")


def _plan(tmp_path: Path, *overrides: str) -> tuple[int, dict[str, Any]]:
    """The plan's exit status and plan.json, as a script reads them."""
    record = plan_job(compose_config(*overrides), run_dir=tmp_path / "run")
    written = plan_json(tmp_path / "run")
    assert written["exit_code"] == record.exit_code
    return written["exit_code"], written


@pytest.fixture
def full_disk(monkeypatch):
    """Every filesystem with 1 byte free, as runner/checkpoint/size.py asks it."""
    monkeypatch.setattr(checkpoint_size.shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 1, 1))


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        (("model=tiny",), ExitCode.OK),
        (("model=llama_70b", "cluster=h100_sxm", "gpus=1"), ExitCode.PLAN_DOES_NOT_FIT),  # the device
        (
            (
                "model=llama_70b",
                "cluster=h200",
                "gpus=8",
                "parallel=zero3_offload",
                "cluster.host_memory_gb=1000",
            ),
            ExitCode.PLAN_DOES_NOT_FIT,
        ),  # the host
        (
            ("model=llama_70b", "cluster=h100_sxm", "parallel=zero3", "gpus=64"),
            ExitCode.PLAN_CONTRACT_NOT_MET,
        ),
        (("model=tiny", "cluster=h100_sxm", "gpus=3"), ExitCode.PLAN_CONTRACT_NOT_MET),
        # the ladder: a layout fits; nothing does; no rung holds global 16 over 7 ranks
        (("model=llama_70b", "cluster=h100_sxm", "gpus=64", "planner.recommend=true"), ExitCode.OK),
        (
            (
                "model=llama_70b",
                "cluster=h100_sxm",
                "gpus=1",
                "planner.recommend=true",
                "cluster.host_memory_gb=100",
            ),
            ExitCode.PLAN_DOES_NOT_FIT,
        ),
        (
            ("model=tiny", "cluster=h100_sxm", "gpus=7", "planner.recommend=true"),
            ExitCode.PLAN_CONTRACT_NOT_MET,
        ),
    ],
)
def test_the_plans_verdict_is_its_exit_status(tmp_path, overrides, code):
    assert _plan(tmp_path, *overrides)[0] == code


def test_checkpoints_a_run_would_be_refused_for_do_not_fit(tmp_path, full_disk, capsys):
    """Periodic checkpoints that cannot fit refuse a run, and exit 3 from its plan; the one checkpoint
    a stop writes only warns a run, and its plan says so but exits 0."""
    assert _plan(tmp_path, "model=tiny", "train.checkpoint_every=10")[0] == ExitCode.PLAN_DOES_NOT_FIT
    assert "train.checkpoint_every=10: " in capsys.readouterr().out
    assert _plan(tmp_path, "model=tiny")[0] == ExitCode.OK
    assert "one checkpoint at a stop" in capsys.readouterr().out


def test_a_named_clusters_filesystem_is_not_weighed_on_this_host(tmp_path, full_disk, capsys):
    code, record = _plan(tmp_path, "model=tiny", "cluster=h100_sxm", "train.checkpoint_every=10")
    out = capsys.readouterr().out
    assert code == ExitCode.OK
    assert "train.checkpoint_every=10: " in out
    assert "the filesystem of cluster=h100_sxm is not seen from here: set cluster.storage_path=" in out
    assert "DOES NOT FIT" not in out
    disk = record["checkpoint_disk"]
    assert (disk["fits"], disk["free_bytes"], disk["filesystem_of"]) == (None, None, None)
    assert disk["checkpoint_bytes"] > 0


def test_cluster_storage_path_names_the_filesystem_to_weigh(tmp_path, full_disk, capsys):
    storage = tmp_path / "lustre"
    storage.mkdir()
    overrides = (
        "model=tiny",
        "cluster=h100_sxm",
        f"cluster.storage_path={storage}",
        "train.checkpoint_every=10",
    )
    code, record = _plan(tmp_path, *overrides)
    assert code == ExitCode.PLAN_DOES_NOT_FIT
    assert f"0.000 GB free on the filesystem of {storage} => DOES NOT FIT" in capsys.readouterr().out
    assert (record["checkpoint_disk"]["filesystem_of"], record["checkpoint_disk"]["fits"]) == (
        str(storage),
        False,
    )


@pytest.fixture
def planned(monkeypatch):
    monkeypatch.setattr(plan_exit, "PLANNED", [])
    return plan_exit


def test_a_sweep_exits_with_its_worst_plan_and_names_those_cells(planned):
    for cell, gpus, code in [(0, 8, 3), (1, 64, 4), (2, 16, 0)]:
        planned.note(cell, ["plan=true", "model=llama_70b", f"gpus={gpus}"], code)
    assert planned.exit_code() == ExitCode.PLAN_DOES_NOT_FIT
    assert planned.summary() == (
        "ladder: 1 of 3 plans do not fit (exit 3): #0 (gpus=8)\n"
        "ladder: 1 of 3 plans hold the batch contract only at another global batch (exit 4): #1 (gpus=64)"
    )


def test_one_plan_says_what_its_status_means(planned):
    assert (planned.exit_code(), planned.summary()) == (ExitCode.OK, None)
    planned.note(None, ["plan=true"], ExitCode.PLAN_CONTRACT_NOT_MET)
    assert planned.exit_code() == ExitCode.PLAN_CONTRACT_NOT_MET
    assert (
        planned.summary() == "ladder: the plan holds the batch contract only at another global batch (exit 4)"
    )
