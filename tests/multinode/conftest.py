"""The multinode tier: one real two-node cluster per test session (tests/multinode/two_nodes.py).

Outside CI a machine that cannot start it (no packages, not root, no namespaces) skips these
tests and says why; in CI (CI=true) the same condition fails them, so the tier cannot go quiet.
The tier's figures (job ids, loss differences, times) are printed after its outcomes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from multinode_runs import CROSS_NODE, Sweep, losses, start_sweep
from slurm.cluster import ClusterStartError
from train_helpers import run_train
from two_nodes import LINK, TwoNodeCluster, network_cannot_start_reason, start_two_nodes

MEASURED: list[str] = []


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _cannot_start(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"CI=true but the two-node test cluster cannot start: {reason}", pytrace=False)
    pytest.skip(f"two-node test cluster unavailable: {reason}")


@pytest.fixture(scope="session")
def two_nodes() -> Iterator[TwoNodeCluster]:
    """A running two-node cluster, stopped (its own daemons, nodes and link only) after the session."""
    reason = network_cannot_start_reason()
    if reason is not None:
        _cannot_start(reason)
    try:
        cluster = start_two_nodes()
    except ClusterStartError as error:
        _cannot_start(str(error))
    MEASURED.append("nodes: " + ", ".join(f"{node.name} {node.addr} on {LINK}" for node in cluster.nodes))
    yield cluster
    cluster.stop()


@pytest.fixture
def launch(two_nodes: TwoNodeCluster) -> Iterator[Callable[..., Sweep]]:
    """``start_sweep`` on the cluster; a sweep still running when the test ends (it failed) is
    killed and its jobs cancelled, so the next test finds the nodes free."""
    started: list[Sweep] = []

    def _launch(sweep_dir: Path, *overrides: str, env: dict[str, str] | None = None) -> Sweep:
        started.append(start_sweep(two_nodes, sweep_dir, *overrides, env=env))
        return started[-1]

    yield _launch
    running = [sweep for sweep in started if sweep.proc.poll() is None]
    for sweep in running:
        sweep.stop()
    if running and (jobs := two_nodes.active_job_ids()):  # one test's jobs at a time: all are its own
        two_nodes.client("scancel", *jobs)


@pytest.fixture
def healthy(two_nodes: TwoNodeCluster) -> Iterator[TwoNodeCluster]:
    """The cluster, given back with every slurmd running and both nodes idle (for a test that kills one)."""
    yield two_nodes
    two_nodes.heal()


@pytest.fixture(scope="session")
def report() -> Callable[[str], None]:
    """Note a measured figure (job ids, loss differences, times): printed at the end of the run."""
    return MEASURED.append


def pytest_terminal_summary(terminalreporter) -> None:
    """The tier's measured figures, one line each, after the tests' outcomes."""
    if MEASURED:
        terminalreporter.section("multinode: what was measured")
        for line in MEASURED:
            terminalreporter.write_line(line)


@dataclass(frozen=True)
class Uninterrupted:
    """The tier's uninterrupted sweep: its directory, and the bytes node 2's link carried meanwhile."""

    sweep_dir: Path
    link_bytes: int


@pytest.fixture(scope="session")
def uninterrupted(two_nodes: TwoNodeCluster, tmp_path_factory) -> Uninterrupted:
    """A sweep of two cells, parallel=zero3 and parallel=ddp, each one rank per node, run once: the
    sweep test reads it, and every stopped job of the tier must end with its zero3 cell's losses."""
    sweep_dir = tmp_path_factory.mktemp("uninterrupted") / "sweep"
    before = two_nodes.nodes[1].link_bytes()
    started = start_sweep(two_nodes, sweep_dir, "parallel=zero3,ddp", *CROSS_NODE)
    returncode, stderr = started.finish(timeout=400)
    assert returncode == 0, stderr[-4000:]
    return Uninterrupted(sweep_dir, two_nodes.nodes[1].link_bytes() - before)


@pytest.fixture(scope="session")
def one_node_losses(tmp_path_factory) -> Callable[[str], dict[int, float]]:
    """The sweep's layout on one node (the local launcher, two ranks on this host), per parallel=."""
    done: dict[str, dict[int, float]] = {}

    def _losses(parallel: str) -> dict[int, float]:
        if parallel not in done:
            run_dir = tmp_path_factory.mktemp(f"one_node_{parallel}") / "run"
            overrides = [o for o in CROSS_NODE if not o.startswith("cluster.")]
            result = run_train(f"parallel={parallel}", *overrides, run_dir=run_dir)
            assert result.returncode == 0, result.stderr[-3000:]
            done[parallel] = losses(run_dir)
        return done[parallel]

    return _losses
