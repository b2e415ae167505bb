"""A rank whose collective fails because another rank's process ended says so.

When a rank's process dies (the kernel's out-of-memory killer, a crash, ``kill -9``) the other
ranks learn of it at their next collective, by an error of the transport rather than any
word of the dead rank: gloo's "Connection closed by peer" or "Connection reset by peer"
(gloo/transport/tcp/pair.cc), NCCL's "remote process exited or there was a network error"
(``ncclRemoteError``), torch's ``DistNetworkError``. Such an error is an effect; the cause is
in the launcher's report: ladder's own launcher names the dead rank first (launchers/run.py),
torchrun its "Root Cause (first observed failure)", SLURM the job's state. The note added
here says so, with what the kernel's counts of out-of-memory kills say of the time since
this rank started (runner/diagnose/oom_killer.py).

Across nodes the note names the node: gloo's error carries the peer's address
(``Connection closed by peer [10.0.0.2]:43678``, ``Read error [10.0.0.2]:43678: Connection
reset by peer``), and the ranks told each other their nodes and addresses as they joined
(runner/engine/distributed.py ``members``). summary.json then records ``lost_node``. Rank
0 learns of a lost node at its next collective, when the kernel on that node closes the
dead rank's connections (a killed rank or slurmd, a crashed process); docs/multi-node.md
says what a node that vanishes without a word (power, a cut link) leaves it waiting for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner.diagnose.oom_killer import OomCounts, killer_verdict
from runner.rundir.run_files import add_note
from runner.rundir.summary import write_lost_node

if TYPE_CHECKING:
    from runner.engine.distributed import Member

PEER_LOST_WORDS = (
    "Connection closed by peer",  # gloo
    "Connection reset by peer",  # gloo, a socket's ECONNRESET
    "remote process exited",  # NCCL's ncclRemoteError
)


def is_peer_lost(error: BaseException) -> bool:
    """True for a collective's error that says another rank's process is gone."""
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch.distributed as dist

    network_error = getattr(dist, "DistNetworkError", None)
    if network_error is not None and isinstance(error, network_error):
        return True
    return any(words in str(error) for words in PEER_LOST_WORDS)


# gloo writes a peer as [address]:port (gloo/transport/tcp/address.cc Address::str).
_PEER = re.compile(r"\[([0-9A-Fa-f.:]+)(?:%[\w.-]+)?\]:\d+")


@dataclass(frozen=True)
class LostPeer:
    """The node whose connection a collective lost, its ranks, and the address the error named."""

    node: str
    ranks: tuple[int, ...]
    address: str


def lost_peer(error: BaseException, group: tuple[Member, ...] | None = None) -> LostPeer | None:
    """The node of the peer the error names, when the ranks told each other where they run."""
    if group is None:
        # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
        from runner.engine.distributed import members

        group = members()
    for address in _PEER.findall(str(error)):
        ranks = tuple(member.rank for member in group if address in member.addresses)
        if ranks:
            node = next(member.node for member in group if member.rank == ranks[0])
            return LostPeer(node=node, ranks=ranks, address=address)
    return None


def peer_lost_words(before: OomCounts, proc: Path = Path("/proc"), lost: LostPeer | None = None) -> str:
    """The note: another rank ended first, where its launcher says how, and the kernel's counts."""
    if lost is None:
        words = (
            "another rank's process ended first and this rank learned of it at its next collective: "
            "the launcher's report names that rank and how it ended (torchrun: its Root Cause; "
            "SLURM: the job's state)"
        )
    else:
        ranks = ", ".join(map(str, lost.ranks))
        words = (
            f"lost node {lost.node}: the connection to rank {ranks} there ({lost.address}) closed, so that "
            f"rank's process ended first or its node was lost, and this rank learned of it at its next "
            f"collective: SLURM's job state (NODE_FAIL, and a requeue where the job allows one) or the "
            f"launcher's report says how it ended"
        )
    verdict = killer_verdict(before, None, log="", proc=proc)
    if verdict is None:
        return words
    if verdict.by_oom_killer:
        return f"{words}; {verdict.words.replace('while it ran', 'while this rank ran')}"
    return f"{words}; the kernel's out-of-memory killer ended nothing on this host while this rank ran"


def explain(error: BaseException, before: OomCounts, run_dir: Path | None = None) -> None:
    """Add the note to ``error`` if another rank's end caused it, and record the lost node in
    ``run_dir``'s summary.json when the error names one; nothing otherwise."""
    if not is_peer_lost(error):
        return
    lost = lost_peer(error)
    add_note(error, peer_lost_words(before, lost=lost))
    if lost is not None and run_dir is not None:
        write_lost_node(run_dir, node=lost.node, ranks=lost.ranks)
