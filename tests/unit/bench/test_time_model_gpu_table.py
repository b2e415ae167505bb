"""bench/time_model_gpu_table.py: the step-time model beside every committed GPU step."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from train_helpers import ROOT

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "bench" / "time_model_gpu_table.py"
_spec = importlib.util.spec_from_file_location("time_model_gpu_table", SCRIPT)
assert _spec is not None and _spec.loader is not None
table = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = table  # its dataclasses look their module up there
_spec.loader.exec_module(table)


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[dict]]:
    """The script run once on the committed measurements, with --fit (planning only: no GPU)."""
    import contextlib
    import io
    import json

    rows = tmp_path_factory.mktemp("table") / "rows.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        table.main(["--fit", "--json", str(rows)])
    return out.getvalue().splitlines(), json.loads(rows.read_text())


def test_every_committed_gpu_step_is_planned_beside_its_measurement(printed) -> None:
    lines, rows = printed
    assert len(rows) >= 15 and all(row["predicted_s"] and row["measured_s"] for row in rows)
    assert {row["source"] for row in rows} >= {
        "docs/benchmarks.md",
        "docs/gpu_check/2026-12-04-h200-speed/peer.json",
        "docs/gpu_check/2026-12-04-h200-speed/run_zero3_micro1/metrics.jsonl",
    }
    assert lines[-1].startswith("median_abs_err=") and f"rows={len(rows)}" in lines[-1]
    assert any(line.startswith("not predicted: transformers loop") for line in lines)


def test_the_zero3_rows_name_the_fitted_figure_and_the_fit_is_the_files(printed) -> None:
    """Every ZeRO-3 row rests on h200.json's fitted hook figure and says so; no other row does;
    --fit gives back the figure the file holds (to its four digits)."""
    import json

    lines, rows = printed
    for row in rows:
        assert row["fitted"] == (["zero3_hook_s"] if row["zero3"] else []), row["label"]
    fit = next(line for line in lines if line.startswith("fit: zero3_hook_s="))
    figure = float(fit.split("=")[1].split()[0])
    recorded = json.loads((SCRIPT.parents[1] / "conf/cluster/calibration/h200.json").read_text())
    assert figure == pytest.approx(recorded["zero3_hook_s"], rel=1e-3)
    assert len(recorded["fitted"]["zero3_hook_s"]["data"]) == sum(row["zero3"] for row in rows) >= 2


def test_a_runs_median_leaves_out_its_first_and_its_profiled_step(tmp_path) -> None:
    import json

    steps = [9.0, 1.0, 1.1, 5.0, 1.2]  # step 3 ran under train.profile_step
    lines = [json.dumps({"step": i, "time/step_s": s}) for i, s in enumerate(steps)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"profile": {"step": 3}}))
    assert table._metrics_median(tmp_path) == pytest.approx(1.1)
