"""Sweeps on a real one-node SLURM cluster: what a user sees from ``-m hydra/launcher=slurm``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from train_helpers import (
    CAPPED_ENV,
    OUT_OF_MEMORY_RUN,
    ROOT,
    address_space_cap_for_out_of_memory,
    clean_env,
    earlier_sweep,
    file_digests,
    injecting,
)

from runner.hardware.host_allocator import jemalloc_installed

pytestmark = pytest.mark.slurm

HOSTILE_NAME = "ladder; touch PWNED_NAME $(touch PWNED_SUB)"


def test_each_cell_is_one_job_whose_tasks_are_its_ranks(sweep, slurm_cluster, tmp_path):
    # A sweep directory and a job name that a shell would split or run, were they unquoted.
    sweep_dir = tmp_path / "sweep $(touch PWNED_DIR) dir"
    before = set(slurm_cluster.job_ids())
    result = sweep(
        "parallel=zero1,zero3",
        "gpus=2",
        "train.steps=3",
        "logger=none",
        f"hydra.launcher.name='{HOSTILE_NAME}'",
        sweep_dir=sweep_dir,
    )
    assert result.returncode == 0, result.stderr[-4000:]

    summaries = [json.loads((sweep_dir / cell / "summary.json").read_text()) for cell in ("0", "1")]
    assert [s["parallel"] for s in summaries] == ["zero1", "zero3"]
    job_ids, array_elements = set(), set()
    for summary in summaries:
        assert summary["status"] == "completed"
        assert summary["steps_completed"] == 3
        assert summary["launcher"] == "slurm"
        assert summary["layout"]["gpus"] == 2
        slurm = summary["slurm"]
        assert (slurm["nodes"], slurm["tasks"], slurm["tasks_per_node"]) == (1, 2, 1 * 2)
        assert slurm["job_name"] == HOSTILE_NAME
        job_ids.add(slurm["job_id"])
        array_elements.add(f"{slurm['array_job_id']}_{slurm['array_task_id']}")
    assert len(job_ids) == 2, "each cell runs as its own SLURM job"
    assert array_elements == set(slurm_cluster.job_ids()) - before

    # Both SLURM tasks of each job ran the cell and returned: two ranks, not one rank twice.
    for cell in ("0", "1"):
        results = sorted(
            p.name.split("_")[-2]
            for p in (sweep_dir / ".submitit").glob("*/*_result.pkl")
            if p.parent.name.endswith(f"_{cell}")
        )
        assert results == ["0", "1"]
    assert not list(tmp_path.rglob("PWNED*")), "a value from an override reached a shell unquoted"
    # The CPU ranks ran on the C allocator the local launcher gives them (train.host_allocator=auto).
    allocator = "jemalloc" if jemalloc_installed() else "system"
    for cell in ("0", "1"):
        assert f"host allocator: {allocator}" in (sweep_dir / cell / "train.log").read_text()
    # And SLURM saw both jobs end well: no rank aborted on its way out.
    assert {element: _final_state(slurm_cluster, element) for element in array_elements} == dict.fromkeys(
        array_elements, "COMPLETED"
    )


def _final_state(cluster, job_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = cluster.client("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").stdout.strip()
        if state not in ("RUNNING", "COMPLETING", "PENDING") or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def test_sweep_larger_than_the_cluster_is_refused_before_submission(sweep, slurm_cluster):
    before = set(slurm_cluster.job_ids())
    started = time.monotonic()
    result = sweep("gpus=2,4", "train.steps=3", "logger=none")
    assert result.returncode == 2, result.stderr[-4000:]
    assert time.monotonic() - started < 60
    assert "nothing was submitted" in result.stderr
    assert "gpus=4 needs 2 nodes" in result.stderr
    assert "partition 'debug' has 1 node x" in result.stderr
    assert "try gpus in {1, 2}" in result.stderr
    assert set(slurm_cluster.job_ids()) == before, "no job may be queued, not even the cell that fits"
    assert not result.sweep_dir.exists()  # nothing of the refused sweep is left behind


def test_checkpoints_that_cannot_fit_the_sweeps_filesystem_are_refused_before_submission(
    sweep, slurm_cluster, tmp_path
):
    """Cells of a job array may save at once: each cell's peak, summed, must fit (a tmpfs here)."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", str(small)], check=True)
    try:
        before = set(slurm_cluster.job_ids())
        common = ["train.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=1", "logger=none"]
        # tiny fp32: ddp 38.8 MB and ZeRO-3 38.8 MB a checkpoint, 2 each at their peak: 155 MB
        result = sweep("parallel=ddp,zero3", *common, sweep_dir=small / "sweep")
        assert result.returncode == 2, result.stderr[-4000:]
        assert "nothing was submitted" in result.stderr
        assert "the sweep's 2 cells with train.checkpoint_every need 0.155 GB" in result.stderr
        assert "if they all save at once" in result.stderr
        assert set(slurm_cluster.job_ids()) == before
        # One cell alone: its own 3 x 38.8 MB do not fit either, and it is named.
        result = sweep(
            "parallel=ddp",
            "train.steps=6",
            "train.checkpoint_every=2",
            "logger=none",
            sweep_dir=small / "one",
        )
        assert result.returncode == 2, result.stderr[-4000:]
        assert "train.checkpoint_every=2: the run's checkpoints need 3 x 0.039 GB" in result.stderr
        assert set(slurm_cluster.job_ids()) == before
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_gpus_that_do_not_split_over_nodes_are_refused_with_nearest_values(sweep, slurm_cluster):
    before = set(slurm_cluster.job_ids())
    result = sweep("cluster=a100_80g", "gpus=9", "batch.global_size=72", "train.steps=3", "logger=none")
    assert result.returncode == 2, result.stderr[-4000:]
    assert "9 ranks do not split evenly over 2 nodes" in result.stderr
    assert "try gpus=8 or gpus=10" in result.stderr
    assert set(slurm_cluster.job_ids()) == before


def test_request_slurm_rejects_fails_fast_and_leaves_nothing_queued(sweep, slurm_cluster):
    before = set(slurm_cluster.job_ids())
    started = time.monotonic()
    result = sweep("gpus=2", "train.steps=3", "logger=none", "hydra.launcher.constraint=no_such_feature")
    assert result.returncode == 2, result.stderr[-4000:]
    assert time.monotonic() - started < 60
    assert "SLURM refused the sweep" in result.stderr
    assert "Invalid feature specification" in result.stderr
    assert not set(slurm_cluster.active_job_ids()) - before


def test_a_cell_that_fails_on_its_ranks_fails_the_sweep_with_its_reason(sweep, tmp_path):
    # Rank 1 raises at step 1 (the environment reaches the job: sbatch exports it by default).
    result = sweep("gpus=2", "train.steps=3", "logger=none", extra_env=injecting(LADDER_INJECT_FAULT="1:1"))
    assert result.returncode == 1, result.stderr[-4000:]
    summary = json.loads((result.sweep_dir / "0" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["failed_rank"] == 1
    assert "fault injected" in summary["error"]
    assert summary["slurm"]["tasks"] == 2


def test_a_rank_out_of_memory_under_slurm_says_where_with_the_plans_terms(sweep):
    """A real allocator refusal in a SLURM task: the job's address space capped (``ulimit -v``,
    passed on by sbatch) below the step's 3.1 GB of planned activations. The sweep's last lines
    and the cell's summary carry the rank's own words: where, the plan's terms, the cap."""
    cap = address_space_cap_for_out_of_memory()
    result = sweep(*OUT_OF_MEMORY_RUN, extra_env=CAPPED_ENV, address_space=cap)
    assert result.returncode == 1, result.stderr[-4000:]
    error = json.loads((result.sweep_dir / "0" / "summary.json").read_text())["error"]
    assert "can't allocate memory" in error and "out of memory before its first step ended" in error
    assert "activations 3.12 GB at micro 64" in error and f"capped at {cap / 1e9:.2f} GB (ulimit -v)" in error
    # The sweep's own line for the cell, not only the task log's tail below it.
    said = [line for line in result.stderr.splitlines() if "SlurmJobFailed: cell #0" in line]
    assert said and error in said[-1], result.stderr[-4000:]


def test_cells_with_different_gpus_get_their_own_tasks(sweep):
    result = sweep("gpus=1,2", "train.steps=2", "logger=none")
    assert result.returncode == 0, result.stderr[-4000:]
    by_gpus = {}
    for cell in ("0", "1"):
        summary = json.loads((result.sweep_dir / cell / "summary.json").read_text())
        assert summary["status"] == "completed"
        by_gpus[summary["layout"]["gpus"]] = summary["slurm"]
    assert (by_gpus[1]["tasks"], by_gpus[2]["tasks"]) == (1, 2)
    assert by_gpus[1]["job_id"] != by_gpus[2]["job_id"]
    # Once both jobs ended: the cells in one table, and the command that compares them.
    assert f"sweep {result.sweep_dir}: 2 of 2 cells completed" in result.stdout
    command = f"compare the cells: ladder report {result.sweep_dir}  (--html report.html for charts)"
    assert result.stdout.rstrip().endswith(command), result.stdout[-2000:]


def test_a_refused_sweep_resume_on_slurm_leaves_every_file_as_it_was(sweep, slurm_cluster, tmp_path):
    """tests/e2e/test_resumed_sweep_files.py under the SLURM launcher, which checks every cell before
    it submits any: the second cell refused, the first is not submitted either, and nothing is touched."""
    sweep_dir = tmp_path / "sweep"
    earlier_sweep(sweep_dir, ["0", "1"])
    before, jobs = file_digests(sweep_dir), set(slurm_cluster.job_ids())
    result = sweep(
        "train.resume=auto", "logger=none", "data=synthetic", "train.steps=1,0", sweep_dir=sweep_dir
    )
    assert result.returncode == 2, result.stderr[-4000:]
    assert "train.steps=0" in result.stderr
    assert file_digests(sweep_dir) == before
    assert set(slurm_cluster.job_ids()) == jobs


def test_ctrl_c_stops_watching_and_leaves_the_jobs_running_with_how_to_follow_them(slurm_cluster, tmp_path):
    """Ctrl-C on the launching process (SIGINT to its terminal's group): no traceback, the job ids
    with how to follow and stop them, and the sweep's job runs on to its end in SLURM.

    The SIGINT waits for the state it needs, not for a time: the launcher has said it queued the
    job (it watches from then on), and the job is still pending, held behind a job that takes
    the whole node until the launcher has stopped. Started with SIGINT ignored, as a command a
    script runs with ``&`` is, the launcher still takes Ctrl-C (``ctrl_c_interrupts``)."""
    sweep_dir = tmp_path / "sweep"
    blocker = slurm_cluster.client(
        "sbatch", "--parsable", "--exclusive", "--output=/dev/null", "--wrap", "sleep 600"
    ).stdout.strip()
    try:
        assert _state_becomes(slurm_cluster, blocker, "RUNNING"), slurm_cluster.logs()
        before = set(slurm_cluster.job_ids())
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "train.py"),
                "-m",
                "hydra/launcher=slurm",
                "gpus=1",
                "train.steps=3",
                "logger=none",
                f"hydra.sweep.dir={sweep_dir}",
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(slurm_cluster.env()),
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        said = _read_until(proc, "SLURM job(s) ")
        (job_id,) = set(slurm_cluster.job_ids()) - before
        assert f"SLURM job(s) {job_id}: " in said
        assert _final_state(slurm_cluster, job_id, timeout=0) == "PENDING"
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        slurm_cluster.client("scancel", blocker)
    output = said + rest
    assert proc.returncode == 130, output[-3000:]
    assert "Traceback" not in output
    assert f"go on in SLURM: {job_id}" in rest and f"scancel {job_id}" in rest
    assert f"ladder report {sweep_dir}" in rest
    assert _final_state(slurm_cluster, job_id, timeout=240) == "COMPLETED"
    assert json.loads((sweep_dir / "0" / "summary.json").read_text())["status"] == "completed"


def _read_until(proc: subprocess.Popen[str], fragment: str) -> str:
    """The process's output up to and including the first line holding ``fragment``."""
    assert proc.stdout is not None
    lines = []
    while fragment not in (line := proc.stdout.readline()):
        assert line, f"it ended ({proc.wait()}) before saying {fragment!r}:\n{''.join(lines)[-3000:]}"
        lines.append(line)
    return "".join([*lines, line])


def _state_becomes(cluster, job_id: str, state: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while cluster.client("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip() != state:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
