"""A rank reads its place from its launcher's variables and arguments."""

from __future__ import annotations

import os
import socket
import time

import pytest

from runner import environment
from runner.engine.distributed import cpu_threads, init_distributed
from runner.environment import (
    DistributedEnv,
    RendezvousError,
    from_environment,
    rendezvous_problems,
    take_local_rank_argument,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--local_rank=1", "gpus=2"],
        ["train.py", "--local-rank=1", "gpus=2"],
        ["train.py", "--local_rank", "1", "gpus=2"],
    ],
)
def test_the_deepspeed_launchers_local_rank_argument_leaves_hydras_command_line(argv):
    environ: dict[str, str] = {}
    take_local_rank_argument(argv, environ)
    assert argv == ["train.py", "gpus=2"]
    assert environ == {"LOCAL_RANK": "1"}


def test_local_rank_from_the_environment_wins_and_overrides_stay():
    argv = ["train.py", "--local_rank=0", "train.steps=3", "hydra.run.dir=x"]
    environ = {"LOCAL_RANK": "3"}
    take_local_rank_argument(argv, environ)
    assert argv == ["train.py", "train.steps=3", "hydra.run.dir=x"]
    assert environ == {"LOCAL_RANK": "3"}


# --- before the rendezvous: what would leave ranks on several nodes waiting for each other --------

TWO_NODE_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "node-[1-2]",
    "SLURMD_NODENAME": "node-2",
}
NOT_KNOWN = socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def _resolver(table: dict[str, str]):
    """getaddrinfo that answers from ``table`` (host -> IPv4 address) and sends no query."""

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        if host not in table:
            raise NOT_KNOWN
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (table[host], port or 0))]

    return getaddrinfo


def _slurm_env(**extra: str) -> DistributedEnv:
    env = from_environment({**TWO_NODE_TASK, **extra})
    assert env is not None
    return env


def test_a_slurm_job_meets_on_its_first_node_unless_the_job_sets_master_addr():
    env = _slurm_env()
    assert (env.master_addr, env.spans_nodes) == ("node-1", True)
    assert "SLURM_JOB_NODELIST=node-[1-2]" in env.master_from
    given = _slurm_env(MASTER_ADDR="10.1.2.3")
    assert (given.master_addr, given.master_from) == ("10.1.2.3", "MASTER_ADDR")


def test_a_master_addr_that_does_not_resolve_is_refused_with_the_host_the_node_and_the_fix(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _resolver({}))
    (problem,) = rendezvous_problems(_slurm_env(), backend="nccl", environ=TWO_NODE_TASK)
    assert "MASTER_ADDR node-1 (the first node of SLURM_JOB_NODELIST=node-[1-2]) does not resolve" in problem
    assert "on node-2 (rank 1): Name or service not known" in problem
    assert "Make node-1 resolve on every node" in problem and "export MASTER_ADDR=<its IP address>" in problem
    assert "Interfaces on node-2 (rank 1): " in problem and "lo 127.0.0.1" in problem


def test_the_refusal_comes_before_the_process_group_is_joined(monkeypatch):
    """init_distributed raises at once: no rendezvous to wait at, no DeepSpeed imported for it."""
    monkeypatch.setattr(socket, "getaddrinfo", _resolver({}))
    for key, value in TWO_NODE_TASK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RANK", raising=False)
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=r"MASTER_ADDR node-1 .* does not resolve on node-2"):
        init_distributed(_slurm_env(), accelerator="cpu")
    assert time.monotonic() - started < 5
    assert "RANK" not in os.environ  # nothing of the rendezvous was exported


def test_a_master_addr_on_this_nodes_loopback_is_refused_only_where_the_job_spans_nodes(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _resolver({"localhost": "127.0.0.1", "node-2": "10.0.0.2"}))
    monkeypatch.setattr(environment, "gloo_listen_address", lambda host: "10.0.0.2")
    (problem,) = rendezvous_problems(_slurm_env(MASTER_ADDR="localhost"), backend="gloo", environ={})
    assert "MASTER_ADDR localhost (MASTER_ADDR) is 127.0.0.1" in problem and "a loopback address" in problem
    one_node = {**TWO_NODE_TASK, "SLURM_JOB_NUM_NODES": "1", "MASTER_ADDR": "localhost"}
    env = from_environment(one_node)
    assert env is not None and not env.spans_nodes
    assert rendezvous_problems(env, backend="gloo", environ={}) == []


def test_gloo_across_nodes_refuses_a_host_name_that_makes_it_listen_on_loopback(monkeypatch):
    """Debian's /etc/hosts maps the host's own name to 127.0.1.1: gloo would listen there."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node-2")
    monkeypatch.setattr(socket, "getaddrinfo", _resolver({"node-1": "10.0.0.1", "node-2": "127.0.1.1"}))
    (problem,) = rendezvous_problems(_slurm_env(), backend="gloo", environ=TWO_NODE_TASK)
    assert "this host's name node-2 resolves to 127.0.1.1 on node-2 (rank 1)" in problem
    assert "Set GLOO_SOCKET_IFNAME to the interface the nodes share" in problem
    # NCCL picks its interface itself (NCCL_SOCKET_IFNAME), whatever the host name says.
    assert rendezvous_problems(_slurm_env(), backend="nccl", environ=TWO_NODE_TASK) == []
    # A name that does not resolve at all: gloo falls back to the loopback address, as bad.
    monkeypatch.setattr(socket, "getaddrinfo", _resolver({"node-1": "10.0.0.1"}))
    (problem,) = rendezvous_problems(_slurm_env(), backend="gloo", environ=TWO_NODE_TASK)
    assert "node-2 does not resolve to an address of this node" in problem


def test_gloo_socket_ifname_must_name_an_interface_of_this_node(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _resolver({"node-1": "10.0.0.1"}))
    named = {**TWO_NODE_TASK, "GLOO_SOCKET_IFNAME": "lo"}  # every Linux host has it
    assert rendezvous_problems(_slurm_env(), backend="gloo", environ=named) == []
    wrong = {**TWO_NODE_TASK, "GLOO_SOCKET_IFNAME": "ib7"}
    (problem,) = rendezvous_problems(_slurm_env(), backend="gloo", environ=wrong)
    assert "GLOO_SOCKET_IFNAME=ib7: no interface ib7 on node-2 (rank 1)" in problem


def test_a_cpu_rank_takes_the_cores_its_launcher_bound_it_to_or_its_share_of_the_host(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert cpu_threads(local_world_size=2) == 4  # two ranks share the host's 8 cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {6})
    assert cpu_threads(local_world_size=2) == 1  # bound to one core (taskset, SLURM's task/affinity)
