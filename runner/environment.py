"""Where a rank learns who it is: torchrun / the deepspeed launcher, SLURM, or the local launcher.

torchrun and ``deepspeed`` export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT. SLURM exports SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the node
list; the master is the first node of the job and its port is derived from the job id,
so every task of a job agrees on it without talking.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedEnv:
    """One rank's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # "torchrun", "slurm" or "local"

    def exports(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous reads."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


# SLURM's ports: below Linux's default ephemeral range (net.ipv4.ip_local_port_range,
# 32768-60999), where the kernel picks ports for outgoing connections that could take ours.
SLURM_PORT_BASE = 15000
SLURM_PORTS = 32768 - SLURM_PORT_BASE


def slurm_port(job_id: str, restarts: int = 0) -> int:
    """A port every task of a SLURM job derives alike from its job id (in 15000-32767).

    The whole id modulo the range: jobs whose ids lie fewer than 17768 apart (those
    submitted around the same time, an array's tasks) never share a port on a node. A
    requeued job keeps its id; its ``restarts``-th run (SLURM_RESTART_COUNT) moves 10000
    ports on, since the run before may still hold the old port while its ranks exit (seen:
    EADDRINUSE at the requeued job's rendezvous on a loaded node).
    """
    digits = re.sub(r"\D", "", job_id) or "0"
    return SLURM_PORT_BASE + (int(digits) + restarts * 10000) % SLURM_PORTS


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list: ``scontrol show hostnames``, else a parse of ``a[1-3,7]``."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    head = nodelist.split(",")[0] if "[" not in nodelist.split(",")[0] else nodelist
    match = re.match(r"^([^\[,]+)\[([^\]]+)\]", head)
    if match:
        prefix, ranges = match.groups()
        first = ranges.split(",")[0].split("-")[0]
        return prefix + first
    return head


def from_environment(environ: Mapping[str, str]) -> DistributedEnv | None:
    """The rank's place from an external launcher's variables, or None when started alone."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        world = int(environ["WORLD_SIZE"])
        return DistributedEnv(
            rank=int(environ["RANK"]),
            world_size=world,
            local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world)),
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(environ.get("MASTER_PORT", "29500")),
            source="torchrun",
        )
    if "SLURM_PROCID" in environ and int(environ.get("SLURM_NTASKS", "1")) > 1:
        world = int(environ["SLURM_NTASKS"])
        nodes = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1")))
        job_id = environ.get("SLURM_JOB_ID", "0")
        return DistributedEnv(
            rank=int(environ["SLURM_PROCID"]),
            world_size=world,
            local_rank=int(environ.get("SLURM_LOCALID", "0")),
            local_world_size=world // max(1, nodes),
            master_addr=first_host(environ.get("SLURM_JOB_NODELIST", "127.0.0.1")),
            master_port=slurm_port(job_id, restarts=int(environ.get("SLURM_RESTART_COUNT") or 0)),
            source="slurm",
        )
    return None


def take_local_rank_argument(argv: list[str], environ: MutableMapping[str, str]) -> None:
    """Remove ``--local_rank=N`` (or ``--local-rank N``) from ``argv``, keeping N in LOCAL_RANK.

    The ``deepspeed`` launcher passes it to every rank unless given ``--no_local_rank``, as
    torch's deprecated ``torch.distributed.launch`` did; Hydra's command line would refuse it.
    """
    kept: list[str] = []
    args = iter(argv)
    for arg in args:
        flag, equals, value = arg.partition("=")
        if flag in ("--local_rank", "--local-rank"):
            value = value if equals else next(args, "")
            environ.setdefault("LOCAL_RANK", value)
            continue
        kept.append(arg)
    argv[:] = kept


def shared_run_dir(environ: Mapping[str, str], *, today: str) -> str | None:
    """A run directory every rank of an externally launched job computes alike, or None.

    Hydra's default directory holds the start time, which differs between ranks started
    by torchrun or srun; these ranks name it after what their launcher shares instead:
    SLURM's job and step ids, torchrun's rendezvous id, or the master's address, port and
    the launching process (one node).
    """
    if "SLURM_JOB_ID" in environ and int(environ.get("SLURM_NTASKS", "1")) > 1:
        step = environ.get("SLURM_STEP_ID", "0")
        return f"outputs/{today}/slurm-{environ['SLURM_JOB_ID']}.{step}"
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    run_id = environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id and run_id != "none":
        return f"outputs/{today}/torchrun-{run_id}"
    addr = environ.get("MASTER_ADDR", "127.0.0.1")
    port = environ.get("MASTER_PORT", "0")
    return f"outputs/{today}/dist-{addr}-{port}-{os.getppid()}"
