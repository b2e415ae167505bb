"""Process-group life cycle: pick the accelerator, join the group, leave it cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from runner.environment import (
    DistributedEnv,
    RendezvousError,
    node_addresses,
    rendezvous_problems,
    this_node,
)


@dataclass(frozen=True)
class Member:
    """Where one rank of the group runs: its node's name and the addresses its peers see it at."""

    rank: int
    node: str
    addresses: tuple[str, ...]


# The group's members, gathered as it is joined by a job that spans nodes: when a rank's
# connection to another fails, the address in the error names that rank's node
# (runner/diagnose/peer_loss.py). Process-wide, as the process group itself is.
_members: tuple[Member, ...] = ()


def members() -> tuple[Member, ...]:
    """Every rank's node and addresses (empty unless the group spans nodes)."""
    return _members


def skip_inference_shm_op() -> None:
    """Keep DeepSpeed from JIT-building its CPU shared-memory all-reduce when the group starts.

    ``deepspeed.comm``'s TorchBackend builds and loads the ``deepspeed_shm_comm`` extension
    on the CPU accelerator, but only ``inference_all_reduce`` uses it: training reduces
    through the process group (gloo). The build costs about 45 s of compiling on a fresh
    machine (2 cores) and again whenever torch's extension cache decides to rebuild. Marking
    the op incompatible in DeepSpeed's probe table makes ``build_shm_op`` return None.
    """
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    import deepspeed.ops

    try:
        compatible = deepspeed.ops.__compatible_ops__
    except AttributeError:  # a DeepSpeed without the probe table builds nothing here
        return
    compatible["deepspeed_shm_comm"] = False


def init_distributed(env: DistributedEnv, *, accelerator: str) -> tuple[torch.device, float]:
    """Join the process group (nccl on CUDA, gloo on CPU); return this rank's device and the
    seconds the join took (mostly the wait for the last rank to arrive at the rendezvous).

    Refuses first (RendezvousError) what would leave ranks on several nodes waiting for each
    other until the group's timeout: runner/environment.py ``rendezvous_problems``.
    """
    backend = "nccl" if accelerator == "cuda" else "gloo"
    problems = rendezvous_problems(env, backend=backend, environ=os.environ)
    if problems:
        raise RendezvousError("; ".join(problems))
    os.environ.update(env.exports())
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    import deepspeed

    if accelerator == "cpu":
        skip_inference_shm_op()
    joining = time.time()
    with _stop_ends_the_join():
        deepspeed.init_distributed(
            dist_backend=backend,
            auto_mpi_discovery=False,
            timeout=timedelta(minutes=10),
        )
    joined_s = time.time() - joining
    if accelerator == "cuda":
        torch.cuda.set_device(env.local_rank)
        device = torch.device("cuda", env.local_rank)
    else:
        torch.set_num_threads(cpu_threads(env.local_world_size))
        device = torch.device("cpu")
    if env.spans_nodes:
        _gather_members(env)  # after set_device: NCCL's all-gather runs on this rank's GPU
    return device, joined_s


def _gather_members(env: DistributedEnv) -> None:
    """Learn where every rank runs: one all-gather of a few names as the group starts."""
    global _members
    mine = Member(rank=env.rank, node=this_node(os.environ), addresses=tuple(node_addresses()))
    gathered: list[Member | None] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    _members = tuple(member for member in gathered if member is not None)


def cpu_threads(local_world_size: int) -> int:
    """Threads for one CPU rank: the cores it may run on, not shared with another rank of its node.

    Ranks sharing a host share its cores; oversubscribed threads would slow every rank. A
    launcher that binds each rank to cores of its own (SLURM's task/affinity or a cpuset, taskset)
    has split them already: the rank's affinity mask is then narrower than the host.
    """
    total = os.cpu_count() or 1
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    return max(1, allowed if allowed < total else total // local_world_size)


@contextlib.contextmanager
def _stop_ends_the_join() -> Iterator[None]:
    """SIGTERM ends the rank at once while it joins the group: it has nothing to save yet.

    The join waits in C++ (the TCPStore rendezvous, up to the group's timeout), where no Python
    handler runs, so the stop handler (runner/train/preemption.py) would only note the signal.
    When another rank refused (``rendezvous_problems``) or died before the rendezvous, srun
    --kill-on-bad-exit's SIGTERM would then wait out SLURM's KillWait (30 s) before its SIGKILL.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def barrier() -> None:
    """Wait for every rank of the group (nothing without one).

    Under nccl it names this rank's GPU: a group DeepSpeed joined without binding a device
    (it binds none for a single rank, DeepSpeed 0.19.8 comm/torch.py) would otherwise make
    torch guess it and warn "barrier(): using the device under current context" each run.
    """

    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def teardown(*, ok: bool = True) -> None:
    """Barrier, then destroy the group: without it gloo ranks abort at exit.

    After a failure there is no barrier: the other ranks may be waiting in another
    collective, and a barrier would hang this rank with them instead of letting it exit
    (its launcher then stops the others).
    """

    if not (dist.is_available() and dist.is_initialized()):
        return
    if ok:
        try:
            barrier()
        finally:
            dist.destroy_process_group()
