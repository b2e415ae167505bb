"""Preemption on a real one-node SLURM cluster: a signalled job saves, is requeued and resumes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from train_helpers import run_train

pytestmark = pytest.mark.slurm

STEPS = 12
# No periodic checkpoints: the only one is written when the signal arrives.
ARGS = ["gpus=2", f"train.steps={STEPS}", "train.checkpoint_every=0", "logger=none"]


def _losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m["loss"] for m in map(json.loads, lines)}


def _reference(run_dir: Path) -> dict[int, float]:
    """The same run uninterrupted, by the local launcher: two gloo ranks, the same seed and data."""
    done = run_train(*ARGS, run_dir=run_dir, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _losses(run_dir)


def _final_state(cluster, job_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = cluster.client("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").stdout.strip()
        if state not in ("RUNNING", "COMPLETING", "PENDING") or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def test_a_signalled_job_checkpoints_requeues_and_ends_with_the_uninterrupted_losses(
    sweep, slurm_cluster, tmp_path
):
    sweep_dir = tmp_path / "sweep"
    run_dir = sweep_dir / "0"
    outcome: list = []
    launching = threading.Thread(target=lambda: outcome.append(sweep(*ARGS, sweep_dir=sweep_dir)))
    launching.start()
    try:
        # Signal the job as SLURM does before its time limit, once a few steps are logged.
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 150
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert launching.is_alive(), f"the sweep ended before it was signalled: {outcome}"
            assert time.monotonic() < deadline, "no training steps after 150 s"
            time.sleep(0.1)
        first = json.loads((run_dir / "summary.json").read_text())["slurm"]
        # One cell: submitit submits a plain job, not an array of one.
        job_id = first["job_id"] if first["array_job_id"] is None else f"{first['array_job_id']}_0"
        signalled = slurm_cluster.client("scancel", "--signal=USR2", job_id)
        assert signalled.returncode == 0, signalled.stderr
        reference = _reference(tmp_path / "reference")  # runs while the job is requeued
    finally:
        launching.join(timeout=300)
    assert not launching.is_alive(), "the sweep did not finish"
    (result,) = outcome
    assert result.returncode == 0, result.stderr[-4000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    assert summary["steps_completed"] == STEPS
    (stop,) = summary["interruptions"]
    assert (stop["signal"], stop["requeued"], stop["slurm_restart"]) == ("SIGUSR2", True, 0)
    assert 3 <= stop["completed_steps"] < STEPS
    assert summary["resumed_from_step"] == stop["completed_steps"]
    assert (run_dir / "checkpoints" / stop["checkpoint"]).is_dir()
    # The same SLURM job ran again (same id, restarted once), in the same run directory.
    assert summary["slurm"]["job_id"] == first["job_id"]
    assert summary["slurm"]["restarts"] == 1
    assert _final_state(slurm_cluster, job_id) == "COMPLETED"
    # Both runs of the job are one run's attempts: the time in the queue between them, no step lost.
    stopped, finished = summary["goodput"]["attempts"]
    assert [a["launcher"] for a in (stopped, finished)] == ["slurm", "slurm"]
    assert (stopped["status"], stopped["to_step"]) == ("interrupted", stop["completed_steps"])
    assert (finished["from_step"], finished["to_step"]) == (stop["completed_steps"], STEPS)
    assert summary["goodput"]["steps_lost"] == 0 and summary["goodput"]["between_attempts_s"] > 0

    losses = _losses(run_dir)
    assert sorted(losses) == list(range(STEPS)), "each step logged once"
    assert losses == pytest.approx(reference, abs=0.0)  # fp32 on CPU: bit-identical
