"""A sweep whose cells each span both nodes: one rank per node, gloo across the link."""

from __future__ import annotations

import pytest
from multinode_runs import losses, max_difference, summary
from two_nodes import SUBNET, host_addresses

pytestmark = pytest.mark.multinode


@pytest.mark.parametrize(("cell", "parallel"), [("0", "zero3"), ("1", "ddp")])
def test_each_cell_runs_one_rank_on_each_node_with_the_one_node_losses(
    uninterrupted, one_node_losses, report, cell, parallel
):
    run_dir = uninterrupted.sweep_dir / cell
    recorded = summary(run_dir)
    assert (recorded["status"], recorded["parallel"]) == ("completed", parallel)
    slurm = recorded["slurm"]
    assert (slurm["nodes"], slurm["tasks"], slurm["tasks_per_node"]) == (2, 2, 1)
    assert slurm["nodelist"] == "ladder-n[1-2]"
    worst = max_difference(losses(run_dir), one_node_losses(parallel))
    job, nodes = slurm["job_id"], slurm["nodelist"]
    report(f"sweep {parallel}: job {job} on {nodes}, max |loss - one node| = {worst:.3g}")
    assert worst <= 1e-6


def test_the_ranks_talked_over_the_link_whose_addresses_exist_only_in_the_nodes(uninterrupted, report):
    # Two cells of 20 steps, each step reducing (and under ZeRO-3 gathering) the fp32 gradients
    # and parameters of a 3.5-million-parameter model between the two ranks: gigabytes, where
    # SLURM's own messages are kilobytes.
    report(f"link: the sweep moved {uninterrupted.link_bytes / 1e9:.2f} GB over node 2's ladder0")
    assert uninterrupted.link_bytes > 1e9
    assert not [address for address in host_addresses() if address.startswith(SUBNET)]
