"""A collective that lost its peer across nodes names the peer's node, in the error and in summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.diagnose.oom_killer import OomCounts
from runner.diagnose.peer_loss import explain, lost_peer
from runner.engine import distributed
from runner.engine.distributed import Member
from runner.rundir.run_files import with_notes

pytestmark = pytest.mark.unit

GROUP = (
    Member(rank=0, node="gpu-017", addresses=("10.0.0.17", "fd00::17")),
    Member(rank=1, node="gpu-018", addresses=("10.0.0.18", "fd00::18")),
    Member(rank=2, node="gpu-018", addresses=("10.0.0.18", "fd00::18")),
)
# As gloo's transport/tcp/pair.cc words them (torch 2.13's): a reset while reading (seen when a
# rank on another node was killed), a close, and a peer over IPv6.
RESET = "[gloo/transport/tcp/pair.cc:537] Read error [10.0.0.18]:43678: Connection reset by peer"
CLOSED = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [fd00::18]:20365"
NO_COUNTS = OomCounts(host=None, cgroup=None, cgroup_dir=None)


def test_the_address_in_gloos_error_names_the_node_and_its_ranks():
    for words in (RESET, CLOSED):
        lost = lost_peer(RuntimeError(words), GROUP)
        assert lost is not None and (lost.node, lost.ranks) == ("gpu-018", (1, 2))
    assert lost_peer(RuntimeError("Connection closed by peer [10.9.9.9]:1"), GROUP) is None
    assert lost_peer(RuntimeError(RESET), ()) is None  # one node: the ranks did not gather


def test_the_lost_node_goes_into_the_note_and_the_summary(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(distributed, "_members", GROUP)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed"}))
    error = RuntimeError(RESET)
    explain(error, NO_COUNTS, tmp_path)
    assert "; lost node gpu-018: the connection to rank 1, 2 there (10.0.0.18) closed" in with_notes(error)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["lost_node"], summary["lost_ranks"]) == ("gpu-018", [1, 2])
    other = ValueError("bad value")
    explain(other, NO_COUNTS, tmp_path)
    assert with_notes(other) == "ValueError: bad value"
