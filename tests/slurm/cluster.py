"""A real one-node SLURM cluster in a temporary directory, for the test suite (or a shell).

It runs munged, slurmctld and slurmd from Debian's ``slurm-wlm`` and ``munge`` packages
(SLURM 22.05) as root with no systemd and no cgroups, every file under one temporary
directory, and stops only the processes it started. Each slurm.conf line that is not a
path says why it is there; the keys are documented at
https://slurm.schedmd.com/slurm.conf.html. The cluster has no accounting database, so
scripts/slurm_stand_ins/sacct goes first on the PATH it hands out.

    python tests/slurm/cluster.py     # start one, print its SLURM_CONF, stop on Enter
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# scripts/slurm_stand_ins/sacct answers submitit's state queries from squeue: this
# cluster has no accounting database, and without it submitit cannot see a job fail.
STAND_INS = ROOT / "scripts" / "slurm_stand_ins"
PARTITION = "debug"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")


class ClusterStartError(RuntimeError):
    """The cluster did not come up; the message carries the daemons' last log lines."""


def which(name: str) -> str | None:
    """A program on PATH, or in /usr/sbin and /sbin where Debian puts daemons (not on every PATH)."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(("/usr/sbin", "/sbin")))


def program(name: str) -> str:
    path = which(name)
    if path is None:
        raise ClusterStartError(f"{name} not found")
    return path


def cannot_start_reason() -> str | None:
    """Why a cluster cannot be started on this machine, or None when it can be tried."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if which(name) is None]
    if missing:
        return f"SLURM/munge programs not found: {', '.join(missing)} (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root to launch job steps; run the SLURM tests as root"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def node_line(
    name: str,
    *,
    addr: str = "127.0.0.1",
    hostname: str | None = None,
    memory_share: float = 1.0,
    gres: str | None = None,
) -> str:
    """A node line with this host's shape as ``slurmd -C`` reports it, and RealMemory under what is
    free (``memory_share`` of it: nodes that share one host's memory each get their part)."""
    out = subprocess.run([program("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(item.split("=", 1) for item in out.split("\n", 1)[0].split() if "=" in item)
    available_mb = int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20)
    memory = int(min(int(fields.get("RealMemory", available_mb)), available_mb) * 8 // 10 * memory_share)
    shape = " ".join(
        f"{key}={fields[key]}"
        for key in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
        if key in fields
    )
    where = f"NodeAddr={addr}" + (f" NodeHostname={hostname}" if hostname else "")
    extra = f" Gres={gres}" if gres else ""
    return f"NodeName={name} {where} {shape} RealMemory={memory}{extra} State=UNKNOWN"


def slurm_conf(
    root: Path,
    *,
    host: str,
    ctld_port: int,
    slurmd_port: int,
    first_job_id: int,
    ctld_addr: str = "127.0.0.1",
    nodes: Sequence[str] | None = None,
    partition_nodes: str | None = None,
    per_node: bool = False,
    extra: Sequence[str] = (),
) -> str:
    """slurm.conf, every path under ``root`` (see slurm.conf(5)): one node ``host`` on 127.0.0.1
    by default; ``nodes`` (node lines) and ``partition_nodes`` for more, ``per_node`` to give each
    node's slurmd its own pid, log and spool; ``extra`` lines go before the nodes."""
    return "\n".join(
        [
            "ClusterName=ladder",  # slurmctld is fatal without one
            f"SlurmctldHost={host}({ctld_addr})",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",  # the tests run as root; no slurm user is needed
            "SlurmdUser=root",
            "AuthType=auth/munge",
            # cred_expire: a requeued job waits this long (+1 s) before it may start again;
            # SLURM's default of 120 s would dominate the requeue test.
            f"AuthInfo=socket={root / 'munge' / 'munge.socket'},cred_expire=5",
            f"StateSaveLocation={root / 'state'}",
            # %n: the node's name, so that several slurmd on one host keep their own files.
            f"SlurmdSpoolDir={(root / 'spool' / '%n') if per_node else (root / 'spool')}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / ('slurmd-%n.pid' if per_node else 'slurmd.pid')}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / ('slurmd-%n.log' if per_node else 'slurmd.log')}",
            f"PlugStackConfig={root / 'plugstack.conf'}",  # empty: no SPANK plugins from /etc
            # No systemd or cgroups here: the cgroup defaults fail every task launch.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",  # cores are allocated; memory is only checked
            "MpiDefault=none",
            "MailProg=/bin/true",  # no mailer here
            # Without it a job larger than the node is accepted and pends forever.
            "EnforcePartLimits=ALL",
            # Batch jobs start within a second; sched_interval: the main scheduling pass every
            # second, not 60, so a requeued job starts as soon as its begin time has passed.
            "SchedulerParameters=batch_sched_delay=0,sched_interval=1",
            "MinJobAge=3600",  # squeue (and the sacct stand-in) keep finished jobs an hour
            "ReturnToService=2",  # the node is usable as soon as slurmd registers
            f"FirstJobId={first_job_id}",  # from the clock: see clock_job_id()
            *extra,
            *(nodes if nodes is not None else [node_line(host)]),
            f"PartitionName={PARTITION} Nodes={partition_nodes or host} Default=YES MaxTime=INFINITE "
            "State=UP",
            "",
        ]
    )


def clock_job_id() -> int:
    """Job ids from the clock: a fresh state directory would restart them at 1, and a reused
    folder with %j in it would meet an old job's files (MaxJobId is 67043328)."""
    return 1000 + int(time.time()) % 60_000_000


def alive(pid: int) -> bool:
    """True while ``pid`` runs: a stopped daemon lingers as a zombie, so read its state."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass
class SlurmCluster:
    """A running one-node cluster: its directory, slurm.conf, partition and daemons."""

    root: Path
    conf: Path
    host: str
    partition: str = PARTITION
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    owns_root: bool = False

    def env(self) -> dict[str, str]:
        """Variables that point SLURM's clients (and submitit) at this cluster."""
        path = os.pathsep.join([str(STAND_INS), os.environ.get("PATH", "")])
        return {"SLURM_CONF": str(self.conf), "PATH": path}

    def client(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command (sbatch, squeue, ...) against this cluster."""
        return subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **self.env()},
        )

    def job_ids(self) -> list[str]:
        """Every job this cluster knows, finished ones included (MinJobAge keeps them)."""
        out = self.client("squeue", "-h", "-r", "-t", "all", "-o", "%i").stdout
        return out.split()

    def active_job_ids(self) -> list[str]:
        """Jobs pending, running or completing."""
        out = self.client("squeue", "-h", "-r", "-t", "PD,R,CG,CF,S", "-o", "%i").stdout
        return out.split()

    def _start(self, name: str, argv: list[str], log: Path) -> None:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in the test terminal is not theirs
                env={**os.environ, "SLURM_CONF": str(self.conf)},
            )
        self.procs[name] = proc
        time.sleep(0.05)
        if proc.poll() is not None:
            raise ClusterStartError(f"{name} exited at once ({proc.returncode}):\n{self.logs()}")

    def logs(self, lines: int = 15) -> str:
        """The last lines of each daemon's log, for a failure message."""
        parts = []
        names = ("munged.log", "slurmctld.log", "slurmd*.log", "slurmctld.out", "slurmd*.out")
        for path in (path for name in names for path in sorted(self.root.glob(name))):
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(parts) or "(no logs)"

    def _wait(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterStartError(f"{name} died while waiting for {what}:\n{self.logs()}")
            time.sleep(0.1)
        raise ClusterStartError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.logs()}")

    def _node_idle(self) -> bool:
        out = self.client("sinfo", "-h", "-p", self.partition, "-o", "%T").stdout.strip()
        return out == "idle"

    def _probe(self, timeout: float) -> None:
        """Run one batch job: slurmctld's first scheduling pass comes seconds after start."""
        submitted = self.client("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true")
        if submitted.returncode != 0:
            raise ClusterStartError(f"probe job refused: {submitted.stderr}\n{self.logs()}")
        job = submitted.stdout.strip().split(";")[0]

        def finished() -> bool:
            state = self.client("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.strip()
            if state in ("FAILED", "CANCELLED", "NODE_FAIL", "BOOT_FAIL"):
                raise ClusterStartError(f"probe job {job} ended {state}:\n{self.logs()}")
            return state == "COMPLETED"

        self._wait(f"probe job {job}", finished, timeout)

    def _start_munge(self, timeout: float) -> None:
        """Make the directories and munge's key, start munged and wait for its socket."""
        for sub in ("munge", "state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # munged refuses a socket whose directory path is not o+x all the way up.
        os.chmod(self.root, 0o755)
        os.chmod(self.root / "munge", 0o755)
        (self.root / "plugstack.conf").write_text("")
        key = self.root / "munge" / "munge.key"
        subprocess.run([program("mungekey"), "-c", "-f", "-k", str(key)], check=True, capture_output=True)
        munge = self.root / "munge"
        self._start(
            "munged",
            [
                program("munged"),
                "-F",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'munged.seed'}",
                f"--log-file={self.root / 'munged.log'}",
                "-S",
                str(munge / "munge.socket"),
            ],
            self.root / "munged.out",
        )
        self._wait("munge socket", (munge / "munge.socket").exists, timeout)

    def start(self, timeout: float = 60) -> None:
        """Write the configuration, start munged, slurmctld, slurmd; return once a job has run."""
        self._start_munge(timeout)
        self.conf.write_text(
            slurm_conf(
                self.root,
                host=self.host,
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
                first_job_id=clock_job_id(),
            )
        )
        self._start(
            "slurmctld", [program("slurmctld"), "-D", "-f", str(self.conf)], self.root / "slurmctld.out"
        )
        self._start(
            "slurmd",
            [program("slurmd"), "-D", "-f", str(self.conf), "-N", self.host],
            self.root / "slurmd.out",
        )
        self._wait("node idle", self._node_idle, timeout)
        self._probe(timeout)

    def stop(self, timeout: float = 20) -> None:
        """Cancel this cluster's jobs, then stop the daemons it started (by pid, newest first)."""
        running = [proc.poll() is None for proc in self.procs.values()]
        if "slurmctld" in self.procs and all(running):
            # Cancel before slurmd goes, or job steps are left running behind it.
            active = self.active_job_ids()
            if active:
                self.client("scancel", *active)
                deadline = time.monotonic() + timeout
                while self.active_job_ids() and time.monotonic() < deadline:
                    time.sleep(0.2)
        for name, proc in reversed(self.procs.items()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if alive(proc.pid):
                raise RuntimeError(f"{name} (pid {proc.pid}) still runs after SIGKILL")
        self.procs.clear()
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(root: Path | None = None, *, timeout: float = 60) -> SlurmCluster:
    """Start a one-node cluster (in a new temporary directory unless ``root`` is given)."""
    reason = cannot_start_reason()
    if reason is not None:
        raise ClusterStartError(reason)
    owns = root is None
    # Not under pytest's tmp_path: pytest makes those 0700 and munged needs o+x on the path.
    directory = Path(tempfile.mkdtemp(prefix="ladder-slurm-")) if root is None else root
    cluster = SlurmCluster(
        root=directory, conf=directory / "slurm.conf", host=socket.gethostname().split(".")[0], owns_root=owns
    )
    try:
        cluster.start(timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


if __name__ == "__main__":
    running = start_cluster()
    print(f"export SLURM_CONF={running.conf} PATH={STAND_INS}:$PATH")
    try:
        input("cluster up; press Enter to stop it\n")
    finally:
        running.stop()
