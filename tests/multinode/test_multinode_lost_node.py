"""Node 2 dies mid-step: rank 0 ends at once naming it, SLURM requeues the job, it resumes.

The test kills everything of node 2 (its slurmd, the job's slurmstepd and rank 1), as a node
that crashes; its kernel (the machine's) closes rank 1's connections, so rank 0's next
collective fails at once with the peer's address, which names the node (runner/diagnose/
peer_loss.py). SLURM then marks the node DOWN after SlurmdTimeout (10 s here, tests/multinode/
two_nodes.py) and requeues the job (NODE_FAIL); when node 2's slurmd is back, the job runs again
from its last checkpoint.
"""

from __future__ import annotations

import time

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
from slurm.cluster import alive

pytestmark = pytest.mark.multinode

EVERY = 4  # a checkpoint every 4 steps: the requeued run resumes from the last one
RANK0_ENDS_WITHIN_S = 30  # docs/multi-node.md: the next collective, and the failure's record


def test_a_lost_node_ends_rank_0_naming_it_and_the_requeued_job_resumes_from_the_last_checkpoint(
    healthy, launch, uninterrupted, tmp_path, report
):
    cluster = healthy
    node_1, node_2 = cluster.nodes
    sweep = launch(tmp_path / "sweep", *STOPPED, f"train.checkpoint_every={EVERY}")
    wait_for(f"{EVERY + 2} steps logged", lambda: logged_steps(sweep.run_dir) >= EVERY + 2, 240)
    job = job_id(sweep.run_dir)
    rank_0 = node_1.task_pid(job, 0)
    assert rank_0 is not None and node_2.task_pid(job, 1) is not None

    killed_at = time.monotonic()
    killed = node_2.kill_all()
    assert killed, "nothing ran on node 2"
    ended_s = wait_for("rank 0 to end", lambda: not alive(rank_0), RANK0_ENDS_WITHIN_S)
    lost = summary(sweep.run_dir)
    assert (lost["status"], lost["failed_rank"], lost["lost_node"]) == ("failed", 0, "ladder-n2"), lost
    assert "lost node ladder-n2: the connection to rank 1 there (10.231.0.2) closed" in lost["error"]
    saved = lost["steps_completed"] // EVERY * EVERY

    # SLURM finds the node silent, marks it down and puts the job back in the queue.
    down_s = wait_for("node 2 down", lambda: cluster.node_state("ladder-n2").startswith("down"), 120)
    wait_for("the job requeued", lambda: cluster.job_state(job) == "PENDING", 60)
    cluster.start_slurmd(node_2)  # the node comes back
    returncode, stderr = sweep.finish(timeout=300)
    assert returncode == 0, stderr[-4000:]
    total_s = time.monotonic() - killed_at

    done = summary(sweep.run_dir)
    assert (done["status"], done["steps_completed"]) == ("completed", STEPS)
    assert (done["slurm"]["job_id"], done["slurm"]["restarts"]) == (job, 1)
    assert done["resumed_from_step"] == saved > 0
    worst = max_difference(losses(sweep.run_dir), losses(uninterrupted.sweep_dir / "0"))
    report(
        f"lost node: job {job}, node 2 killed after step {lost['steps_completed']}: rank 0 ended in "
        f"{ended_s:.1f} s naming {lost['lost_node']}; SLURM marked it down {down_s:.0f} s later; "
        f"requeued run resumed from step {saved}, done {total_s:.0f} s after the kill; "
        f"max |loss - uninterrupted| = {worst:.3g}"
    )
    assert worst == 0.0
