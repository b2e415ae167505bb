"""A real two-node SLURM cluster on one machine: each node a network, UTS and mount namespace.

Each node is a set of namespaces held open by one idle process (``sleep infinity`` under
``unshare --net --uts --mount``): its own hostname, its own loopback, and one end of a veth
pair named ``ladder0`` with its own address. The two ends are the only link between the
nodes, so gloo traffic between a rank on node 1 and a rank on node 2 crosses it, addressed by
hostname. A node's mount namespace binds its own ``/etc/hosts`` (the two nodes' names) and
``/etc/resolv.conf`` (a resolver on the node's own loopback, where nothing listens) over the
machine's: a name not in the hosts file fails at once, and no query leaves the node.

slurmctld runs on node 1 (the head node; SLURM's clients run there too, as on a login node),
one slurmd per node (``slurmd -N <name>``), munged outside the namespaces: its socket is a
file, which both nodes reach. Every address lives only in the namespaces made here. Each
node advertises one stand-in GPU (a GRES whose device file is /dev/null): SLURM places ranks
as on a GPU partition (``cluster.gpus_per_node=1``: one rank per node), and the ranks train
on the CPU. Each node's slurmd, and so its ranks, runs on its own share of the machine's
cores (taskset), as ranks on two hosts would not share cores.

Everything is undone by :meth:`TwoNodeCluster.stop`: the daemons, any process left in a node,
the holders; the namespaces and the link go with their last process.

    PYTHONPATH=tests python tests/multinode/two_nodes.py   # start one, say how to use it, stop on Enter
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm.cluster import (
    STAND_INS,
    ClusterStartError,
    SlurmCluster,
    alive,
    cannot_start_reason,
    clock_job_id,
    node_line,
    program,
    slurm_conf,
    which,
)

LINK = "ladder0"  # the nodes' interface, the same name on both, as eth0 or ib0 on a real cluster
SUBNET = "10.231.0"  # /24 on the link; node i is SUBNET.i
NODE_NAMES = ("ladder-n1", "ladder-n2")
NODE_LIST = "ladder-n[1-2]"
CTLD_PORT, SLURMD_PORT = 6817, 6818  # SLURM's defaults: the namespaces are new, nothing holds them
# slurmctld declares a node that stopped answering DOWN after this (SLURM's default is 300 s);
# a job running on it then ends NODE_FAIL and, being requeueable (JobRequeue=1, the default),
# goes back to the queue.
SLURMD_TIMEOUT_S = 10
NETWORK_TOOLS = ("ip", "unshare", "nsenter", "taskset")


def net_namespace(pid: int) -> str | None:
    """The network namespace of ``pid`` (``net:[4026532...]``), or None when it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _run(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise ClusterStartError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


@dataclass
class Node:
    """One node: its name (hostname and SLURM NodeName), its address, the process that holds it."""

    name: str
    addr: str
    holder: subprocess.Popen[bytes]

    def enter(self, argv: Sequence[str], *, wd: Path | str = "/") -> list[str]:
        """``argv`` run on this node: in its network, UTS and mount namespaces, from ``wd``."""
        nsenter = ["nsenter", "-t", str(self.holder.pid), "--net", "--uts", "--mount", f"--wd={wd}"]
        return [*nsenter, "--", *argv]

    def pids(self) -> list[int]:
        """Every process on this node but its holder."""
        mine = net_namespace(self.holder.pid)
        if mine is None:
            return []
        pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
        return [pid for pid in pids if pid != self.holder.pid and net_namespace(pid) == mine and alive(pid)]

    def link_bytes(self) -> int:
        """Bytes this node has sent and received over its link so far (netlink's counters)."""
        shown = subprocess.run(
            self.enter(["ip", "-j", "-s", "link", "show", "dev", LINK]),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        stats = json.loads(shown)[0]["stats64"]
        return int(stats["rx"]["bytes"]) + int(stats["tx"]["bytes"])

    def task_pid(self, job_id: str, rank: int) -> int | None:
        """The process of SLURM task ``rank`` of job ``job_id`` on this node (its rank), if it runs here."""
        wanted = {b"SLURM_JOB_ID=" + job_id.encode(), b"SLURM_PROCID=" + str(rank).encode()}
        for pid in self.pids():
            try:
                environ = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            # The rank is python itself; srun's command line (on node 1) names the same module.
            program = Path(argv.split(b"\0", 1)[0].decode(errors="replace")).name
            if wanted <= environ and program.startswith("python") and b"submitit.core._submit" in argv:
                return pid
        return None

    def kill_all(self, timeout: float = 10) -> list[int]:
        """SIGKILL every process on this node but its holder (the node's crash); their pids."""
        killed = self.pids()
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while any(alive(pid) for pid in killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        return killed


def _hosts(nodes: Sequence[tuple[str, str]]) -> str:
    return "127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for name, addr in nodes)


@dataclass
class TwoNodeCluster(SlurmCluster):
    """Two nodes in namespaces, slurmctld on the first; SLURM's clients run on the first too."""

    nodes: list[Node] = field(default_factory=list)
    link_names: tuple[str, str] = ("", "")

    @property
    def login(self) -> Node:
        """Node 1, where slurmctld runs and where clients (and a sweep's launching process) run."""
        return self.nodes[0]

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        return next(node for node in self.nodes if node.name == name)

    def hosts_file(self, name: str) -> Path:
        """The file node ``name`` sees as /etc/hosts (rewrite it in place to change what it resolves)."""
        return self.root / "nodes" / name / "hosts"

    def command(self, argv: Sequence[str], *, wd: Path | str = "/") -> list[str]:
        """``argv`` run on the login node (node 1), from ``wd``."""
        return self.login.enter(argv, wd=wd)

    def client(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command (sbatch, squeue, ...) on the login node."""
        return subprocess.run(
            self.command(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **self.env()},
        )

    def _node_states(self) -> dict[str, str]:
        out = self.client("sinfo", "-h", "-N", "-p", self.partition, "-o", "%N|%T").stdout
        return dict(line.split("|", 1) for line in out.split() if "|" in line)

    def node_state(self, name: str) -> str:
        """SLURM's state of node ``name`` (idle, allocated, down*, ...)."""
        return self._node_states().get(name, "")

    def job_state(self, job_id: str) -> str:
        """SLURM's state of job ``job_id`` (PENDING, RUNNING, COMPLETED, ...)."""
        return self.client("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").stdout.strip()

    def _node_idle(self) -> bool:
        return self._node_states() == dict.fromkeys(NODE_NAMES, "idle")

    def _make_nodes(self, timeout: float) -> None:
        """Two holders, each in new network, UTS and mount namespaces; a veth pair between them."""
        for i, name in enumerate(NODE_NAMES, start=1):
            files = self.root / "nodes" / name
            files.mkdir(parents=True, exist_ok=True)
            (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
            (files / "hosts").write_text(_hosts([(n, f"{SUBNET}.{j}") for j, n in enumerate(NODE_NAMES, 1)]))
            # A resolver on the node's own loopback, where nothing listens: no DNS query leaves.
            (files / "resolv.conf").write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:1\n")
            script = (
                f"hostname {name} && mount --bind {files / 'hosts'} /etc/hosts && "
                f"mount --bind {files / 'resolv.conf'} /etc/resolv.conf && exec sleep infinity"
            )
            with (files / "holder.err").open("wb") as errors:
                holder = subprocess.Popen(
                    ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "sh", "-c", script],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    start_new_session=True,
                )
            self.nodes.append(Node(name=name, addr=f"{SUBNET}.{i}", holder=holder))
        for node in self.nodes:
            errors = self.root / "nodes" / node.name / "holder.err"
            self._wait(f"node {node.name}'s namespaces", lambda n=node, e=errors: _holding(n, e), timeout)
        # veth names in this namespace must be unique for the moment before they move.
        tag = f"lad{os.getpid() % 100_000}"
        self.link_names = (f"{tag}a", f"{tag}b")
        _run(["ip", "link", "add", self.link_names[0], "type", "veth", "peer", "name", self.link_names[1]])
        for node, end in zip(self.nodes, self.link_names, strict=True):
            _run(["ip", "link", "set", end, "netns", str(node.holder.pid)])
            inside = node.enter(["ip"])
            _run([*inside, "link", "set", end, "name", LINK])
            _run([*inside, "addr", "add", f"{node.addr}/24", "dev", LINK])
            _run([*inside, "link", "set", LINK, "up"])
            _run([*inside, "link", "set", "lo", "up"])

    def _write_conf(self) -> None:
        share = 1 / len(NODE_NAMES)  # the machine's memory, split between its nodes
        lines = [
            node_line(n.name, addr=n.addr, hostname=n.name, memory_share=share, gres="gpu:1")
            for n in self.nodes
        ]
        self.conf.write_text(
            slurm_conf(
                self.root,
                host=self.login.name,
                ctld_addr=self.login.addr,
                ctld_port=CTLD_PORT,
                slurmd_port=SLURMD_PORT,
                first_job_id=clock_job_id(),
                nodes=lines,
                partition_nodes=NODE_LIST,
                per_node=True,
                extra=["GresTypes=gpu", f"SlurmdTimeout={SLURMD_TIMEOUT_S}"],
            )
        )
        # gres.conf beside slurm.conf: one stand-in GPU per node. SLURM's gpu plugin drops a GPU
        # with no device file (slurmd -G lists none, and the node is set INVAL); /dev/null is one.
        (self.root / "gres.conf").write_text("AutoDetect=off\nName=gpu File=/dev/null\n")

    def start_slurmd(self, node: Node) -> None:
        """Start (or start again) node ``node``'s slurmd, on that node."""
        argv = [program("slurmd"), "-D", "-f", str(self.conf), "-N", node.name]
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) >= len(self.nodes):  # each node its own cores: its tasks inherit them
            share = len(cores) // len(self.nodes)
            mine = cores[self.nodes.index(node) * share : (self.nodes.index(node) + 1) * share]
            argv = ["taskset", "-c", ",".join(map(str, mine)), *argv]
        self._start(f"slurmd {node.name}", node.enter(argv), self.root / f"slurmd-{node.name}.out")

    def start(self, timeout: float = 60) -> None:
        """Make the nodes, write the configuration, start the daemons; return once a job ran on both."""
        self._start_munge(timeout)
        self._make_nodes(timeout)
        self._write_conf()
        ctld = [program("slurmctld"), "-D", "-f", str(self.conf)]
        self._start("slurmctld", self.login.enter(ctld), self.root / "slurmctld.out")
        for node in self.nodes:
            self.start_slurmd(node)
        self._wait("both nodes idle", self._node_idle, timeout)
        self._probe_both(timeout)

    def _probe_both(self, timeout: float) -> None:
        """One job over both nodes: each task says its hostname, as its node's slurmd started it."""
        out = self.root / "probe.out"
        submitted = self.client(
            "sbatch", "--parsable", "-N", "2", f"--output={out}", "--wrap", "srun hostname"
        )
        if submitted.returncode != 0:
            raise ClusterStartError(f"probe job refused: {submitted.stderr}\n{self.logs()}")
        job = submitted.stdout.strip().split(";")[0]

        def finished() -> bool:
            state = self.client("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()
            if state in ("FAILED", "CANCELLED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT"):
                raise ClusterStartError(f"probe job {job} ended {state}:\n{self.logs()}")
            return state == "COMPLETED"

        self._wait(f"probe job {job}", finished, timeout)
        said = sorted(out.read_text().split())
        if said != sorted(NODE_NAMES):
            raise ClusterStartError(f"probe job's tasks said {said}, not {list(NODE_NAMES)}")

    def heal(self, timeout: float = 120) -> None:
        """Start every slurmd that is not running, and wait until both nodes are idle again."""
        for node in self.nodes:
            proc = self.procs.get(f"slurmd {node.name}")
            if proc is None or proc.poll() is not None:
                self.start_slurmd(node)
        self._wait("both nodes idle again", self._node_idle, timeout)

    def stop(self, timeout: float = 20) -> None:
        """Cancel the jobs, stop the daemons, end whatever is left on the nodes, then the nodes."""
        try:
            super().stop(timeout)
        finally:
            for node in self.nodes:
                node.kill_all()
                if node.holder.poll() is None:
                    node.holder.kill()
                node.holder.wait()
            for end in self.link_names:  # only if it never moved into a node
                if end and Path(f"/sys/class/net/{end}").exists():
                    subprocess.run(["ip", "link", "del", end], capture_output=True, check=False)
            self.nodes.clear()


def host_addresses() -> list[str]:
    """The addresses of the machine's own network namespace (where the tests run)."""
    shown = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    return [info["local"] for link in json.loads(shown) for info in link.get("addr_info", [])]


def _holding(node: Node, errors: Path) -> bool:
    """Whether ``node``'s holder has set the node up (it is ``sleep`` by then)."""
    if node.holder.poll() is not None:
        said = errors.read_text(errors="replace").strip() if errors.exists() else ""
        raise ClusterStartError(f"the holder of {node.name} exited ({node.holder.returncode}): {said}")
    try:
        return Path(f"/proc/{node.holder.pid}/comm").read_text().strip() == "sleep"
    except OSError:
        return False


def network_cannot_start_reason() -> str | None:
    """Why two nodes in namespaces cannot be made here, or None when they can be tried."""
    reason = cannot_start_reason()
    if reason is not None:
        return reason
    missing = [name for name in NETWORK_TOOLS if which(name) is None]
    if missing:
        return f"not found: {', '.join(missing)} (apt-get install iproute2 util-linux)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make namespaces here (unshare --net --uts --mount): {probe.stderr.strip()}"
    return None


def start_two_nodes(*, timeout: float = 60) -> TwoNodeCluster:
    """Start a two-node cluster in a new temporary directory (removed again by ``stop``)."""
    reason = network_cannot_start_reason()
    if reason is not None:
        raise ClusterStartError(reason)
    # Not under pytest's tmp_path: pytest makes those 0700 and munged needs o+x on the path.
    directory = Path(tempfile.mkdtemp(prefix="ladder-2nodes-"))
    cluster = TwoNodeCluster(
        root=directory, conf=directory / "slurm.conf", host=NODE_NAMES[0], owns_root=True
    )
    try:
        cluster.start(timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


if __name__ == "__main__":
    running = start_two_nodes()
    login = " ".join(running.command(["bash"]))
    print(f"export SLURM_CONF={running.conf} PATH={STAND_INS}:$PATH; {login}   # a shell on the login node")
    try:
        input("two nodes up; press Enter to stop them\n")
    finally:
        running.stop()
