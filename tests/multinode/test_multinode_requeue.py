"""``scontrol requeue`` of a running two-node job: SIGTERM on both nodes, a checkpoint, the job again."""

from __future__ import annotations

import pytest
from multinode_runs import (
    STEPS,
    STOPPED,
    job_id,
    logged_steps,
    losses,
    max_difference,
    summary,
    wait_for,
)

pytestmark = pytest.mark.multinode


def test_a_requeued_job_saves_at_sigterm_and_ends_with_the_uninterrupted_losses(
    two_nodes, launch, uninterrupted, tmp_path, report
):
    # No periodic checkpoints: the only one is written at the SIGTERM.
    sweep = launch(tmp_path / "sweep", *STOPPED, "train.checkpoint_every=0")
    wait_for("3 steps logged", lambda: logged_steps(sweep.run_dir) >= 3 or sweep.proc.poll() is not None, 240)
    job = job_id(sweep.run_dir)
    requeued = two_nodes.client("scontrol", "requeue", job)
    assert requeued.returncode == 0, requeued.stderr
    returncode, stderr = sweep.finish(timeout=300)
    assert returncode == 0, stderr[-4000:]

    recorded = summary(sweep.run_dir)
    assert (recorded["status"], recorded["steps_completed"]) == ("completed", STEPS)
    (stop,) = recorded["interruptions"]
    assert (stop["signal"], stop["slurm_restart"]) == ("SIGTERM", 0)
    assert 3 <= stop["completed_steps"] < STEPS
    assert recorded["resumed_from_step"] == stop["completed_steps"]
    assert (recorded["slurm"]["job_id"], recorded["slurm"]["restarts"]) == (job, 1)
    assert recorded["slurm"]["nodes"] == 2
    worst = max_difference(losses(sweep.run_dir), losses(uninterrupted.sweep_dir / "0"))
    report(
        f"requeue: job {job} stopped by SIGTERM after {stop['completed_steps']} steps, "
        f"resumed there; max |loss - uninterrupted| = {worst:.3g}"
    )
    assert worst == 0.0  # fp32 on CPU: bit-identical
