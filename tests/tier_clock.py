"""The suite's time per tier and its budget of runs: a pytest plugin (tests/conftest.py loads it),
and the table `make test` ends with.

Time: each pytest process adds up, per tier marker, the seconds of its tests' setup, call and
teardown (under pytest-xdist: the workers' seconds, which overlap), counts their outcomes, and
takes its own wall time. Where ``$LADDER_TIER_TIMES`` names a file, it appends one JSON line
there; ``python tests/tier_clock.py FILE`` prints the lines of one ``make test`` as a table and a
closing line of the outcomes over all of them.

Budget: nearly all of the suite's time is the ``python train.py`` commands its tests start (a
command imports torch and DeepSpeed, starts ranks, trains). The plugin counts every such command
the pytest process starts, by the tier of the test that started it:

- a unit test may start none (the unit tier runs on every core at once): it fails at the start;
- a tier that ran whole may start at most its budget in :data:`BUDGET_FILE`; over it, the session
  fails, naming the tier. A change that adds runs shares them with a test that already makes them
  (tests/conftest.py ``trained_once``), or raises the budget in the same commit, in plain sight.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

TIERS = ("unit", "e2e", "multirank", "slurm", "multinode", "browser", "gpu")
TIMES_ENV = "LADDER_TIER_TIMES"
BUDGET_FILE = Path(__file__).resolve().parent / "run_budget.json"


def _starts_train(args: Any) -> bool:
    """Whether a subprocess's arguments run train.py (directly, or through torchrun or deepspeed)."""
    words = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    return any(str(word).endswith("train.py") for word in words)


def tier_of(keywords: Any) -> str:
    """The tier marker among a test's keywords ("none": a module without one; test_tiers.py refuses it)."""
    return next((tier for tier in TIERS if tier in keywords), "none")


class TierClock:
    """Seconds, outcomes and train.py commands per tier over one pytest process."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.began = time.time()  # to find the span of pytest processes that ran side by side
        self.seconds: collections.Counter[str] = collections.Counter()
        self.outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.runs: collections.Counter[str] = collections.Counter()
        self.tier = "none"  # the tier of the test running now
        self.over_budget: list[str] = []
        self._popen_init = subprocess.Popen.__init__

    def install(self) -> None:
        """Count the train.py commands this process starts (every subprocess goes through Popen)."""
        clock, original = self, self._popen_init

        def counting_init(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
            if _starts_train(args):
                clock.count_run()
            original(popen, args, *rest, **kwargs)

        subprocess.Popen.__init__ = counting_init  # type: ignore[method-assign]

    def uninstall(self) -> None:
        subprocess.Popen.__init__ = self._popen_init  # type: ignore[method-assign]

    def count_run(self) -> None:
        if self.tier == "unit":
            raise RuntimeError(
                "a unit test started python train.py: the unit tier runs on every core at once and "
                "starts no run; move the test to the e2e tier (pytestmark = pytest.mark.e2e)"
            )
        self.runs[self.tier] += 1

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        self.tier = tier_of(item.keywords)
        yield
        self.tier = "none"

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """An xdist worker's train.py commands, counted in the worker, join the controller's."""
        self.runs.update(getattr(node, "workeroutput", {}).get("ladder_runs", {}))

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        if hasattr(config, "workerinput"):  # an xdist worker: hand the counts to the controller
            config.workeroutput["ladder_runs"] = dict(self.runs)  # type: ignore[attr-defined]
            return
        whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
        if not whole or not BUDGET_FILE.is_file():
            return
        budget = json.loads(BUDGET_FILE.read_text())
        for tier, runs in sorted(self.runs.items()):
            if runs > budget.get(tier, 0):
                self.over_budget.append(
                    f"the {tier} tier started {runs} python train.py commands, over its budget of "
                    f"{budget.get(tier, 0)} in {BUDGET_FILE.name}: share the runs with a test that "
                    "already makes them (tests/conftest.py trained_once), or raise the budget in the "
                    "same commit and say why"
                )
        if self.over_budget and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = tier_of(report.keywords)
        self.seconds[tier] += report.duration
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[tier][report.outcome] += 1
        elif report.when == "teardown" and report.outcome == "failed":
            self.outcomes[tier]["error"] += 1

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if hasattr(config, "workerinput"):  # an xdist worker: its controller reports
            return
        workers = getattr(config.option, "numprocesses", None) or 0
        record = {
            "selection": config.option.markexpr or "all",
            "workers": workers,
            "wall_s": round(time.monotonic() - self.started, 1),
            "began": self.began,
            "ended": time.time(),
            "tiers": {
                tier: {
                    "seconds": round(self.seconds[tier], 1),
                    "runs": self.runs[tier],
                    **self.outcomes[tier],
                }
                for tier in sorted(self.seconds, key=lambda t: TIERS.index(t) if t in TIERS else len(TIERS))
            },
        }
        terminalreporter.write_sep("-", "time per tier")
        for line in _tier_lines(record):
            terminalreporter.write_line(line)
        for line in self.over_budget:
            terminalreporter.write_line(f"FAILED budget: {line}", red=True)
        if path := os.environ.get(TIMES_ENV):
            with open(path, "a") as out:
                out.write(json.dumps(record) + "\n")


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s"


def _tier_lines(record: dict[str, Any]) -> list[str]:
    """One line per tier of one pytest process, then its wall time."""
    workers = record["workers"]
    how = f"{workers} workers in parallel: tier seconds overlap" if workers else "one process"
    lines = []
    for tier, figures in record["tiers"].items():
        counts = ", ".join(f"{n} {what}" for what, n in figures.items() if what not in ("seconds", "runs"))
        runs = f"; {figures['runs']} train.py commands" if figures.get("runs") else ""
        lines.append(f"  {tier:<10} {_minutes(figures['seconds']):>14}   {counts}{runs}")
    lines.append(f"  pytest -m {record['selection']!r}: wall {_minutes(record['wall_s'])} ({how})")
    return lines


def summary(path: Path) -> str:
    """The table of every pytest process recorded in ``path``, and the outcomes over all of them."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    totals: collections.Counter[str] = collections.Counter()
    lines = ["time per tier:"]
    for record in records:
        lines += _tier_lines(record)
        for figures in record["tiers"].values():
            totals.update({what: n for what, n in figures.items() if what not in ("seconds", "runs")})
    # the pytest processes ran one after another, or side by side: their span, not their sum
    wall = max(record["ended"] for record in records) - min(record["began"] for record in records)
    lines.append(f"  all tiers: wall {_minutes(wall)} (from the first pytest's start to the last one's end)")
    failed = totals["failed"] + totals["error"]
    lines.append(f"tests: {totals['passed']} passed, {failed} failed, {totals['skipped']} skipped")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
