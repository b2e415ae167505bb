"""What one sweep cell asks SLURM for, and whether the partition can ever give it.

One rank is one SLURM task. A cell with ``gpus`` ranks on nodes that hold ``per_node``
ranks each needs

    nodes = ceil(gpus / per_node),    tasks_per_node = gpus / nodes

and ``gpus`` must split evenly over those nodes (9 ranks on 8-GPU nodes would need 2
nodes of 4.5). ``per_node`` is the cluster group's ``gpus_per_node``; ``cluster=local``
(None: detect) takes the partition's GPUs per node, or on a CPU-only partition its CPUs
per node over ``cpus_per_task``, and then requests no GPUs. Everything here is pure
arithmetic on a :class:`Partition` read by :mod:`launchers.slurm.partition`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


class SlurmRefused(ValueError):
    """A sweep SLURM could not run as asked; the message lists each problem and its fix."""


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one shape in a partition (one line of ``sinfo``)."""

    count: int
    cpus: int
    memory_mb: int  # sinfo %m, MiB (SLURM's "MB")
    gpus: int  # GPUs per node from its GRES; 0 when it has none


@dataclass(frozen=True)
class Partition:
    """A partition's nodes and its time limit (None: no limit)."""

    name: str
    groups: tuple[NodeGroup, ...]
    max_time_min: int | None = None

    @property
    def gpus_per_node(self) -> int:
        """The most GPUs any node of the partition has (0: a CPU-only partition)."""
        return max((g.gpus for g in self.groups), default=0)

    @property
    def cpus_per_node(self) -> int:
        """The most CPUs any node of the partition has."""
        return max((g.cpus for g in self.groups), default=0)

    def describe(self) -> str:
        """``partition 'debug' has 1 node x 2 CPUs, 17745 MiB, no GPUs`` for messages."""
        shapes = "; ".join(
            f"{_count(g.count, 'node')} x {g.cpus} CPUs, {g.memory_mb} MiB, "
            + (f"{g.gpus} GPUs" if g.gpus else "no GPUs")
            for g in self.groups
        )
        return f"partition '{self.name}' has {shapes or 'no nodes'}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class Placement:
    """One cell's request: ranks over nodes, and the GPUs each node must give (None: none)."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int | None


def splits_evenly(gpus: int, per_node: int) -> bool:
    """Whether ``gpus`` ranks split evenly over the ``ceil(gpus / per_node)`` nodes they need."""
    nodes = -(-gpus // per_node)
    return gpus % nodes == 0


def nearest_even_splits(gpus: int, per_node: int) -> tuple[int | None, int]:
    """The nearest rank counts below and above ``gpus`` that split evenly over their nodes."""
    below = next((g for g in range(gpus - 1, 0, -1) if splits_evenly(g, per_node)), None)
    above = next(g for g in itertools.count(gpus + 1) if splits_evenly(g, per_node))
    return below, above


def ranks_per_node(
    *, cluster_gpus_per_node: int | None, partition: Partition, cpus_per_task: int | None
) -> tuple[int, bool]:
    """How many ranks one node holds, and whether ranks are GPUs (then GPUs are requested)."""
    if cluster_gpus_per_node is not None:
        return cluster_gpus_per_node, True
    if partition.gpus_per_node > 0:
        return partition.gpus_per_node, True
    # A CPU-only partition: one rank per cpus_per_task CPUs (SLURM's default is 1).
    return max(1, partition.cpus_per_node // (cpus_per_task or 1)), False


def gpu_problems(*, cluster: str, cluster_gpus_per_node: int | None, partition: Partition) -> list[str]:
    """A cluster group sized for GPUs that the partition's nodes do not have."""
    if cluster_gpus_per_node is None or cluster_gpus_per_node == partition.gpus_per_node:
        return []
    return [
        f"cluster={cluster} has gpus_per_node={cluster_gpus_per_node}, but {partition.describe()}; "
        f"pick that hardware's partition (hydra.launcher.partition=...) or the cluster "
        f"group that matches this one (cluster=local detects it)"
    ]


def place(*, gpus: int, per_node: int, on_gpus: bool, what: str) -> Placement:
    """Nodes and tasks per node for ``gpus`` ranks; refuses a count that does not split evenly."""
    if gpus < 1:
        raise SlurmRefused(f"gpus={gpus}: the number of ranks must be at least 1")
    nodes = -(-gpus // per_node)
    if gpus % nodes:
        below, above = nearest_even_splits(gpus, per_node)
        options = " or ".join(f"gpus={g}" for g in (below, above) if g is not None)
        raise SlurmRefused(
            f"gpus={gpus} on nodes of {per_node} {what} needs ceil({gpus} / {per_node}) = {nodes} nodes, "
            f"and {gpus} ranks do not split evenly over {nodes} nodes ({gpus} / {nodes} = "
            f"{gpus / nodes:g} per node); try {options}"
        )
    tasks = gpus // nodes
    return Placement(nodes=nodes, tasks_per_node=tasks, gpus_per_node=tasks if on_gpus else None)


def _fmt(values: list[int]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def capacity_problems(
    placement: Placement,
    partition: Partition,
    *,
    gpus: int,
    per_node: int,
    cpus_per_task: int | None,
    mem_gb: int | None,
    timeout_min: int,
) -> list[str]:
    """What the partition can never give this placement (SLURM would refuse or pend forever)."""
    problems: list[str] = []
    cpus = placement.tasks_per_node * (cpus_per_task or 1)
    need_gpus = placement.gpus_per_node or 0
    need_mb = (mem_gb or 0) * 1024  # submitit sends --mem={mem_gb}G; SLURM's G is 1024 M
    fitting = sum(
        g.count for g in partition.groups if g.cpus >= cpus and g.gpus >= need_gpus and g.memory_mb >= need_mb
    )
    if fitting < placement.nodes:
        each = f"{_count(placement.tasks_per_node, 'task')} x {_count(cpus_per_task or 1, 'CPU')}"
        each += f", {need_gpus} GPUs" if need_gpus else ""
        each += f", {mem_gb}G memory" if mem_gb else ""
        message = (
            f"gpus={gpus} needs {_count(placement.nodes, 'node')} of ({each}), but {partition.describe()} "
            f"({_count(fitting, 'node')} of them can hold that)"
        )
        most = fitting * per_node
        workable = [g for g in range(1, most + 1) if splits_evenly(g, per_node)]
        if workable:
            nearest = sorted(sorted(workable, key=lambda g: abs(g - gpus))[:6])
            message += f"; try gpus in {_fmt(nearest)}"
        else:
            message += "; lower hydra.launcher.cpus_per_task or mem_gb, or pick another partition"
        problems.append(message)
    if partition.max_time_min is not None and timeout_min > partition.max_time_min:
        problems.append(
            f"hydra.launcher.timeout_min={timeout_min} exceeds the time limit of partition "
            f"'{partition.name}' ({partition.max_time_min} min); set hydra.launcher.timeout_min="
            f"{partition.max_time_min} or less"
        )
    return problems
