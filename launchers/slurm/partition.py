"""Read a partition's nodes from ``sinfo`` before submitting, so a sweep too big is refused.

``sinfo -h -o FORMAT`` prints one line per group of like nodes (sinfo(1)): %P partition
(``*`` marks the default), %D node count, %c CPUs per node, %m memory per node in MB,
%G generic resources (``gpu:8``, ``gpu:a100:4(S:0-1)``, ``(null)``), %l time limit.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence

from launchers.slurm.resources import NodeGroup, Partition, SlurmRefused

SINFO_FORMAT = "%P|%D|%c|%m|%G|%l"
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")

Runner = Callable[[Sequence[str]], str]


def gres_gpus(gres: str) -> int:
    """GPUs in a GRES string: ``gpu:8`` -> 8, ``gpu:a100:4(S:0-1),gpu:v100:2`` -> 6, ``(null)`` -> 0."""
    return sum(int(count) for count in _GPU_GRES.findall(gres))


def parse_time_min(text: str) -> int | None:
    """A SLURM time limit in minutes (``1-12:00:00`` -> 2160); None when unlimited.

    Formats from sbatch(1) --time: minutes, minutes:seconds, hours:minutes:seconds,
    days-hours, days-hours:minutes, days-hours:minutes:seconds.
    """
    text = text.strip()
    if not text or text.lower() in ("infinite", "unlimited", "n/a", "none"):
        return None
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        days = int(head)
        parts = [int(p) for p in text.split(":")] + [0, 0]
        hours, minutes = parts[0], parts[1]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 3:
            hours, minutes = parts[0], parts[1]
        else:
            hours, minutes = 0, parts[0]
    return days * 24 * 60 + hours * 60 + minutes


def parse_sinfo(output: str, name: str | None) -> Partition:
    """The partition ``name`` (None: the default one) from ``sinfo -h -o SINFO_FORMAT`` lines."""
    rows = [line.split("|") for line in output.splitlines() if line.count("|") == 5]
    names = sorted({row[0].rstrip("*") for row in rows})
    wanted = name if name is not None else next((r[0].rstrip("*") for r in rows if r[0].endswith("*")), None)
    if wanted is None or wanted not in names:
        which = f"partition '{name}'" if name is not None else "a default partition"
        raise SlurmRefused(
            f"SLURM has no {which}; set hydra.launcher.partition to one of: {', '.join(names) or '(none)'}"
        )
    groups: list[NodeGroup] = []
    limit: int | None = None
    for part, count, cpus, memory, gres, time_limit in rows:
        if part.rstrip("*") != wanted:
            continue
        groups.append(
            NodeGroup(
                count=int(count),
                cpus=int(cpus.rstrip("+")),
                memory_mb=int(memory.rstrip("+")),
                gpus=gres_gpus(gres),
            )
        )
        limit = parse_time_min(time_limit)
    return Partition(name=wanted, groups=tuple(groups), max_time_min=limit)


def _sinfo(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SlurmRefused(f"cannot ask SLURM about its nodes: {' '.join(argv)}: {error}") from error
    if done.returncode != 0:
        raise SlurmRefused(
            f"cannot ask SLURM about its nodes: {' '.join(argv)} exited {done.returncode}: "
            f"{done.stderr.strip()}; run the sweep from a SLURM login node"
        )
    return done.stdout


def read_partition(name: str | None, run: Runner = _sinfo) -> Partition:
    """The partition a sweep submits to, as ``sinfo`` reports it now."""
    return parse_sinfo(run(["sinfo", "-h", "-o", SINFO_FORMAT]), name)
