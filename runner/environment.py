"""Where a rank learns who it is: torchrun / the deepspeed launcher, SLURM, or the local launcher.

torchrun and ``deepspeed`` export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT. SLURM exports SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the node
list; the master is the first node of the job (or MASTER_ADDR, where the job's environment
sets it) and its port is derived from the job id, so every task of a job agrees on it
without talking.

Before a rank joins the group, :func:`rendezvous_problems` checks what makes ranks on
several nodes wait for each other until the group's timeout instead of failing: a
MASTER_ADDR that does not resolve on this node, or one that resolves to this node's own
loopback; under gloo, a host name that would make gloo listen where no other node reaches
(docs/multi-node.md).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import psutil


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
    master_from: str = "MASTER_ADDR"  # where master_addr came from, for messages

    @property
    def spans_nodes(self) -> bool:
        """Whether the job's ranks run on more than one node (this node holds fewer than all)."""
        return self.world_size > self.local_world_size

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
        nodelist = environ.get("SLURM_JOB_NODELIST", "127.0.0.1")
        # MASTER_ADDR set in the job's environment (sbatch passes the submitter's on) wins, as
        # under Lightning's SLURMEnvironment: a site whose node names are not the names of the
        # network the ranks should meet on says so there.
        given = environ.get("MASTER_ADDR")
        return DistributedEnv(
            rank=int(environ["SLURM_PROCID"]),
            world_size=world,
            local_rank=int(environ.get("SLURM_LOCALID", "0")),
            local_world_size=world // max(1, nodes),
            master_addr=given or first_host(nodelist),
            master_port=slurm_port(job_id, restarts=int(environ.get("SLURM_RESTART_COUNT") or 0)),
            source="slurm",
            master_from="MASTER_ADDR" if given else f"the first node of SLURM_JOB_NODELIST={nodelist}",
        )
    return None


class RendezvousError(RuntimeError):
    """Ranks on several nodes could not meet; the message names the host, this node and the fix."""


def this_node(environ: Mapping[str, str]) -> str:
    """This node's name as SLURM knows it (SLURMD_NODENAME), else its host name."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def resolve(host: str) -> tuple[list[str], str | None]:
    """The addresses ``host`` resolves to on this node (getaddrinfo, any family), or the
    resolver's words for why there are none."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        return [], getattr(error, "strerror", None) or str(error)
    return list(dict.fromkeys(str(info[4][0]) for info in found)), None


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 or ::1 (an IPv6 address may carry a %scope)."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def gloo_listen_address(hostname: str) -> str | None:
    """The address gloo listens on when GLOO_SOCKET_IFNAME is unset, or None: the first of
    ``hostname``'s addresses a socket can bind. So torch's ProcessGroupGloo picks it
    (``createDefaultDevice``: the host name, if it "resolves to a usable address"; else
    the loopback address), and so does gloo (transport/tcp/device.cc, ``lookupAddrForHostname``)."""
    try:
        found = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    for family, kind, proto, _, address in found:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(address)
        except OSError:
            continue
        return str(address[0])
    return None


def node_addresses() -> list[str]:
    """This node's addresses other than loopback, as its peers see its connections come from."""
    found = [
        address.address.split("%", 1)[0]
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
        if address.family in (socket.AF_INET, socket.AF_INET6)
    ]
    return [address for address in dict.fromkeys(found) if not is_loopback(address)]


def interfaces() -> str:
    """This node's network interfaces and their addresses, for a message: ``eth0 10.0.0.2, lo 127.0.0.1``."""
    named = []
    for name, addresses in sorted(psutil.net_if_addrs().items()):
        ips = [a.address for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)]
        named.append(f"{name} {' '.join(ips[:2])}".strip())
    return ", ".join(named) or "none"


def _master_problems(env: DistributedEnv, here: str, host_name: str) -> list[str]:
    """MASTER_ADDR does not resolve here, or (on a node other than its own) names a loopback address."""
    host = env.master_addr
    where = f"on {here} (rank {env.rank})"
    addresses, why = resolve(host)
    if why is not None:
        return [
            f"MASTER_ADDR {host} ({env.master_from}) does not resolve {where}: {why}. Every rank meets "
            f"the others at {host}:{env.master_port}; this one cannot find it. Make {host} resolve on every "
            f"node (DNS, or /etc/hosts), or export MASTER_ADDR=<its IP address> before submitting "
            f"(`getent ahostsv4 {host}` on that node prints it; give an IPv4 address where the nodes' "
            f"network has no IPv6). Interfaces {where}: {interfaces()}"
        ]
    ours = host.split(".", 1)[0] in (here.split(".", 1)[0], host_name.split(".", 1)[0])
    if env.spans_nodes and not ours and all(is_loopback(a) for a in addresses):
        return [
            f"MASTER_ADDR {host} ({env.master_from}) is {', '.join(addresses)} {where}, a loopback "
            f"address, but the job's {env.world_size} ranks span several nodes: this rank would wait for a "
            f"rendezvous on its own node. Set MASTER_ADDR to the name or address of rank 0's node on a "
            f"network every node reaches (unset it under SLURM: the job's first node is taken)"
        ]
    return []


def _gloo_problems(env: DistributedEnv, here: str, host_name: str, environ: Mapping[str, str]) -> list[str]:
    """Under gloo across nodes: the interface GLOO_SOCKET_IFNAME names is missing, or, without it,
    this host's name makes gloo listen where other nodes cannot reach it."""
    where = f"on {here} (rank {env.rank})"
    named = [name.strip() for name in environ.get("GLOO_SOCKET_IFNAME", "").split(",") if name.strip()]
    if named:
        missing = [name for name in named if name not in dict(socket.if_nameindex()).values()]
        if missing:
            return [
                f"GLOO_SOCKET_IFNAME={environ['GLOO_SOCKET_IFNAME']}: no interface {', '.join(missing)} "
                f"{where}; name one that reaches the other nodes. Interfaces {where}: {interfaces()}"
            ]
        return []
    listen = gloo_listen_address(host_name)
    if listen is not None and not is_loopback(listen):
        return []
    said = "does not resolve to an address of this node" if listen is None else f"resolves to {listen}"
    return [
        f"this host's name {host_name} {said} {where}, so gloo would listen on a loopback address, "
        f"which ranks on the job's other nodes cannot reach (they would wait for it until the "
        f"process group's timeout). Set GLOO_SOCKET_IFNAME to the interface the nodes share, or make "
        f"{host_name} resolve to that interface's address. Interfaces {where}: {interfaces()}"
    ]


def rendezvous_problems(env: DistributedEnv, *, backend: str, environ: Mapping[str, str]) -> list[str]:
    """What would keep this rank from meeting the others, before it tries (docs/multi-node.md)."""
    here = this_node(environ)
    host_name = socket.gethostname()
    problems = _master_problems(env, here, host_name)
    if backend == "gloo" and env.spans_nodes:
        problems += _gloo_problems(env, here, host_name, environ)
    return problems


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
