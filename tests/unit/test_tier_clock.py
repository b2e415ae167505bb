"""The suite's own clock and budget (tests/tier_clock.py): what `make test` ends with, and what it
refuses. Driven here through the plugin's own methods, without starting a pytest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tier_clock import BUDGET_FILE, TierClock, summary

pytestmark = pytest.mark.unit


def test_a_unit_test_that_starts_train_py_fails_at_once_and_others_are_counted_by_tier(
    pytestconfig, monkeypatch
):
    session = pytestconfig.pluginmanager.get_plugin("tier_clock")  # this session's own clock, unit now
    monkeypatch.setattr(subprocess.Popen, "__init__", session._popen_init)
    clock = TierClock()
    clock.install()
    try:
        clock.tier = "unit"
        with pytest.raises(RuntimeError, match="move the test to the e2e tier"):
            subprocess.Popen([sys.executable, "train.py", "gpus=1"])
        clock.tier = "e2e"
        subprocess.run([sys.executable, "-c", "pass", "train.py"], check=True)  # counted, and it ran
        subprocess.run([sys.executable, "-c", "pass"], check=True)  # not train.py: not counted
    finally:
        clock.uninstall()
    assert clock.runs == {"e2e": 1}
    assert subprocess.Popen.__init__ is session._popen_init


def _session(args_source: pytest.Config.ArgsSource, keyword: str = "") -> SimpleNamespace:
    config = SimpleNamespace(args_source=args_source, option=SimpleNamespace(keyword=keyword))
    return SimpleNamespace(config=config, exitstatus=pytest.ExitCode.OK)


def test_a_tier_over_its_budget_fails_the_session_when_it_ran_whole():
    budget = json.loads(BUDGET_FILE.read_text())
    clock = TierClock()
    clock.runs.update({"multirank": budget["multirank"] + 1, "e2e": budget["e2e"]})
    whole = _session(pytest.Config.ArgsSource.TESTPATHS)
    clock.pytest_sessionfinish(whole, 0)  # type: ignore[arg-type]
    assert whole.exitstatus == pytest.ExitCode.TESTS_FAILED
    (over,) = clock.over_budget
    assert over.startswith(f"the multirank tier started {budget['multirank'] + 1} python train.py commands")
    # Part of a tier (a file named, -k): its budget says nothing.
    for part in (
        _session(pytest.Config.ArgsSource.ARGS),
        _session(pytest.Config.ArgsSource.TESTPATHS, "ledger"),
    ):
        partial = TierClock()
        partial.runs.update(clock.runs)
        partial.pytest_sessionfinish(part, 0)  # type: ignore[arg-type]
        assert part.exitstatus == pytest.ExitCode.OK and not partial.over_budget


def test_the_end_of_make_test_is_a_table_per_pytest_and_one_line_of_outcomes(tmp_path: Path):
    records = [
        {
            "selection": "unit",
            "workers": 2,
            "wall_s": 90.0,
            "began": 0.0,
            "ended": 90.0,
            "tiers": {"unit": {"seconds": 150.0, "runs": 0, "passed": 910, "failed": 1}},
        },
        {
            "selection": "slurm or multinode",
            "workers": 0,
            "wall_s": 300.0,
            "began": 100.0,
            "ended": 400.0,
            "tiers": {
                "slurm": {"seconds": 90.0, "runs": 13, "passed": 11},
                "multinode": {"seconds": 200.0, "runs": 7, "passed": 7, "skipped": 1},
            },
        },
        {
            "selection": "multirank",
            "workers": 2,
            "wall_s": 800.0,
            "began": 100.0,
            "ended": 900.0,
            "tiers": {"multirank": {"seconds": 1400.0, "runs": 133, "passed": 133}},
        },
    ]
    path = tmp_path / "tier_times.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    text = summary(path)
    assert re.search(r"\n  unit +2 min 30.0 s +910 passed, 1 failed\n", text), text
    assert re.search(r"\n  slurm +1 min 30.0 s +11 passed; 13 train.py commands\n", text), text
    assert "pytest -m 'unit': wall 1 min 30.0 s (2 workers in parallel: tier seconds overlap)" in text
    assert "all tiers: wall 15 min 00.0 s" in text  # side by side: their span, not their sum
    assert text.splitlines()[-1] == "tests: 1061 passed, 1 failed, 1 skipped"
