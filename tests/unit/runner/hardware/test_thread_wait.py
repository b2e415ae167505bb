"""A launcher on a busy host has its CPU ranks' threads sleep while they wait for each other."""

from __future__ import annotations

import pytest

from runner.hardware.thread_wait import BUSY_CORES, WAIT_POLICY, wait_policy

pytestmark = pytest.mark.unit


def test_cpu_ranks_beside_busy_cores_wait_passively_and_say_so():
    policy = wait_policy(cpu_rank=True, environ={}, others_cores=1.9)
    assert policy.env == {WAIT_POLICY: "PASSIVE"}
    assert "other processes hold 1.9 of this host's cores" in policy.words
    assert "set OMP_WAIT_POLICY to choose" in policy.words


@pytest.mark.parametrize(
    ("cpu_rank", "environ", "others_cores"),
    [
        (True, {}, BUSY_CORES / 2),  # a quiet host keeps OpenMP's default
        (True, {}, None),  # the cores' use is unknown (no /proc/stat)
        (True, {WAIT_POLICY: "ACTIVE"}, 2.0),  # the user's choice is kept
        (False, {}, 2.0),  # a GPU rank's threads are not the step's
    ],
)
def test_no_policy_is_added_on_a_quiet_host_for_gpu_ranks_or_over_the_users(cpu_rank, environ, others_cores):
    policy = wait_policy(cpu_rank=cpu_rank, environ=environ, others_cores=others_cores)
    assert (dict(policy.env), policy.words) == ({}, "")
