"""A node on which the rendezvous host does not resolve: its rank refuses at once, and says why."""

from __future__ import annotations

import time

import pytest
from multinode_runs import STOPPED, summary

pytestmark = pytest.mark.multinode


def test_a_master_addr_that_does_not_resolve_on_node_2_is_refused_before_the_collective(
    two_nodes, launch, tmp_path, report
):
    # Node 2 loses its name for node 1, as a node whose DNS or /etc/hosts lacks its peers.
    hosts = two_nodes.hosts_file("ladder-n2")
    kept = hosts.read_text()
    hosts.write_text("".join(line for line in kept.splitlines(True) if "ladder-n1" not in line))
    try:
        started = time.monotonic()
        sweep = launch(tmp_path / "sweep", *STOPPED)
        returncode, stderr = sweep.finish(timeout=240)
        took = time.monotonic() - started
    finally:
        hosts.write_text(kept)  # in place: the node's /etc/hosts is bound to this file
    assert returncode == 1, stderr[-4000:]
    recorded = summary(sweep.run_dir)
    assert (recorded["status"], recorded["failed_rank"]) == ("failed", 1)
    error = recorded["error"]
    assert error.startswith("RendezvousError: MASTER_ADDR ladder-n1 (the first node of "), error
    assert "SLURM_JOB_NODELIST=ladder-n[1-2]) does not resolve on ladder-n2 (rank 1)" in error
    assert "Make ladder-n1 resolve on every node" in error and "export MASTER_ADDR=" in error
    assert "ladder0 10.231.0.2" in error  # the interfaces of the node that refused
    assert "SlurmJobFailed" in stderr and "does not resolve on ladder-n2" in stderr
    job = recorded["slurm"]["job_id"]
    report(
        f"unresolvable MASTER_ADDR: job {job} refused by rank 1 on ladder-n2; the sweep ended in {took:.0f} s"
    )
    # Rank 0 did not wait at the rendezvous: srun ended it as rank 1 failed (no KillWait, no timeout).
    assert took < 90
