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
"""

from __future__ import annotations

from pathlib import Path

from runner.diagnose.oom_killer import OomCounts, killer_verdict
from runner.rundir.run_files import add_note

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


def peer_lost_words(before: OomCounts, proc: Path = Path("/proc")) -> str:
    """The note: another rank ended first, where its launcher says how, and the kernel's counts."""
    words = (
        "another rank's process ended first and this rank learned of it at its next collective: "
        "the launcher's report names that rank and how it ended (torchrun: its Root Cause; "
        "SLURM: the job's state)"
    )
    verdict = killer_verdict(before, None, log="", proc=proc)
    if verdict is None:
        return words
    if verdict.by_oom_killer:
        return f"{words}; {verdict.words.replace('while it ran', 'while this rank ran')}"
    return f"{words}; the kernel's out-of-memory killer ended nothing on this host while this rank ran"


def explain(error: BaseException, before: OomCounts) -> None:
    """Add the note to ``error`` if another rank's end caused it; nothing otherwise."""
    if is_peer_lost(error):
        add_note(error, peer_lost_words(before))
