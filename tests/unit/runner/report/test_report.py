"""``ladder report``: every cell listed (failed, unfinished and missing ones with their error), sorted,
best cells marked, text formats that parse, loss curves compared, and a page that needs no network."""

from __future__ import annotations

import csv
import html
import io
import itertools
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from train_helpers import compose_config

from runner.cli import main
from runner.plan.planner import plan_config
from runner.report.charts import loss_chart, memory_chart, time_chart
from runner.report.collect import collect, expected_sweep
from runner.report.compare import config_diff, loss_agreement
from runner.report.rows import build_rows
from runner.report.svg import nice_ticks
from runner.report.terminal import print_report
from runner.rundir.plan_record import write_plan

pytestmark = pytest.mark.unit

LOSSES = [5.1, 4.5, 4.1, 4.0, 3.9, 3.6, 3.4, 3.25]


def write_cell(
    run_dir: Path,
    *,
    parallel: str = "ddp",
    gpus: int = 1,
    status: str | None = "completed",
    mfu: float = 0.4,
    peak_gb: float = 0.7,
    losses: list[float] | None = None,
    global_size: int = 16,
    precision: str = "fp32",
    error: str | None = None,
    memory: dict[str, Any] | None = None,
    extra_metrics: dict[str, float] | None = None,
    write_summary: bool = True,
) -> Path:
    """A run directory like train.py leaves: .hydra/, metrics.jsonl and (unless told not to) summary.json."""
    losses = LOSSES if losses is None else losses
    hydra = run_dir / ".hydra"
    hydra.mkdir(parents=True)
    config = {
        "model": {"name": "tiny", "n_layer": 4},
        "precision": {"name": precision},
        "parallel": {
            "name": parallel,
            "zero_stage": int(parallel[-1]) if parallel[-1].isdigit() else 0,
            "tp": 1,
            "pp": 1,
        },
        "batch": {"global_size": global_size, "micro_size": "auto"},
        "gpus": gpus,
        "seed": 0,
    }
    (hydra / "config.yaml").write_text(yaml.safe_dump(config))
    (hydra / "overrides.yaml").write_text(
        yaml.safe_dump([f"parallel={parallel}", f"gpus={gpus}", "logger=none"])
    )
    records = [
        {
            "step": step,
            "loss": loss,
            "throughput/mfu": mfu,
            "throughput/tokens_per_s_per_device": 1000 * mfu,
            "memory/peak_gb": peak_gb,
            **(extra_metrics or {}),
        }
        for step, loss in enumerate(losses)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if write_summary:
        summary: dict[str, Any] = {
            "status": status,
            "error": error,
            "name": f"parallel={parallel},gpus={gpus}",
            "model": "tiny",
            "parallel": parallel,
            "precision": precision,
            "layout": {
                "gpus": gpus,
                "dp": gpus,
                "tp": 1,
                "pp": 1,
                "micro_size": global_size // gpus,
                "accum_steps": 1,
                "global_size": global_size,
            },
            "steps_completed": len(losses),
            "final": {
                "loss": losses[-1] if losses else None,
                "throughput/mfu": mfu,
                "memory/peak_gb": peak_gb,
            },
            "peak_flops_source": "measured: matmul calibration",
        }
        if error:
            summary["failed_rank"] = 1
        if memory is not None:
            summary["memory"] = memory
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def write_sweep(root: Path) -> Path:
    """A 2 x 2 sweep (parallel=ddp,zero2 gpus=1,2): two completed cells, one failed, one never started."""
    sweep = root / "sweep"
    sweep.mkdir()
    multirun = {
        "hydra": {
            "sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"},
            "sweeper": {
                "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                "params": None,
            },
            "overrides": {"task": ["parallel=ddp,zero2", "gpus=1,2", "logger=none"]},
        }
    }
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(multirun))
    phases = {"time/step_s": 1.0, "time/forward_s": 0.3, "time/backward_s": 0.6, "time/optimizer_s": 0.1}
    write_cell(sweep / "0", parallel="ddp", gpus=1, mfu=0.30, peak_gb=0.80, extra_metrics=phases)
    write_cell(sweep / "1", parallel="ddp", gpus=2, mfu=0.45, peak_gb=0.60)
    write_cell(
        sweep / "2",
        parallel="zero2",
        gpus=1,
        status="failed",
        error="RuntimeError: CUDA out of memory",
        losses=LOSSES[:3],
        mfu=0.9,
    )
    return sweep


def report_json(*paths: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    assert main(["report", *map(str, paths), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_sweep_lists_every_cell_with_the_error_of_each_that_did_not_complete(tmp_path, capsys):
    rows = report_json(write_sweep(tmp_path), capsys=capsys)
    by_cell = {r["cell"]: r for r in rows}
    assert sorted(by_cell) == ["0", "1", "2", "3"]
    assert by_cell["2"]["status"] == "failed"
    assert by_cell["2"]["error"] == "rank 1: RuntimeError: CUDA out of memory"
    assert by_cell["3"]["status"] == "missing"  # multirun.yaml expects job 3; its directory is absent
    assert by_cell["3"]["overrides"] == "parallel=zero2 gpus=2"
    assert "never started" in by_cell["3"]["error"]
    assert by_cell["1"]["error"] is None


def test_cells_keep_their_job_order_and_the_best_are_marked(tmp_path, capsys):
    rows = report_json(write_sweep(tmp_path), capsys=capsys)
    assert [r["cell"] for r in rows] == ["0", "1", "2", "3"]  # as the sweep numbered them, not by MFU
    assert rows[1]["best"] == "MFU, peak"
    assert rows[0]["best"] == ""
    assert rows[2]["best"] == ""  # the failed cell has the highest MFU, and is never "best"


def test_a_sweep_of_more_than_ten_cells_is_in_job_number_order_in_every_format(tmp_path, capsys):
    for job, mfu in ((3, 0.5), (1, 0.4), (2, 0.3), (0, 0.2), (10, 0.9)):
        write_cell(tmp_path / "sweep" / str(job), gpus=job + 1, mfu=mfu)
    assert [r["cell"] for r in report_json(tmp_path / "sweep", capsys=capsys)] == ["0", "1", "2", "3", "10"]
    assert main(["report", str(tmp_path / "sweep"), "--format", "md"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [line.split("|")[1].strip(" `") for line in table] == ["0", "1", "2", "3", "10"]


def test_a_cell_without_summary_is_unfinished_and_keeps_what_it_logged(tmp_path, capsys):
    write_cell(tmp_path / "run", losses=LOSSES[:4], write_summary=False)
    (row,) = report_json(tmp_path / "run", capsys=capsys)
    assert row["status"] == "unfinished"
    assert "stopped after logging step 4" in row["error"]  # steps 0-3 logged: the console said 4/8
    assert row["final_loss"] == LOSSES[3]
    assert row["gpus"] == 1 and row["global_size"] == 16 and row["dp"] == 1  # from the composed config
    assert row["micro_size"] is None  # "auto" and never resolved


def test_a_cell_refused_before_launch_is_listed(tmp_path, capsys):
    (tmp_path / "refused" / ".hydra").mkdir(parents=True)
    (tmp_path / "refused" / ".hydra" / "config.yaml").write_text("gpus: 3\n")
    (row,) = report_json(tmp_path / "refused", capsys=capsys)
    assert row["status"] == "unfinished"
    assert "refused before launch" in row["error"]


def test_a_planned_cell_shows_its_plan_and_is_not_taken_for_a_crash(tmp_path, capsys):
    """``-m ... plan=true`` leaves each cell .hydra/ and plan.json: the report lists the cells as
    planned, with the plan's terms as their estimate, its peak on the plan line and its verdict."""
    cell = tmp_path / "0"
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "config.yaml").write_text("gpus: 2\nparallel: {name: zero3, zero_stage: 3}\n")
    planned = plan_config(compose_config("model=tiny")).record()
    memory = replace(
        planned.memory_bytes, params=2.5e8, grads=2.5e8, optimizer=5e8, activations=1.5e9, peak=3.2e9
    )
    time = replace(planned.time, step_s=3.79, step_s_is_lower_bound=True, mfu=0.42, calibration=None)
    write_plan(cell, replace(planned, memory_bytes=memory, fits=False, time=time))
    (row,) = report_json(tmp_path, capsys=capsys)
    assert row["status"] == "planned"
    assert row["error"] == (
        "plan=true: nothing launched; planned peak 3.2 GB per device (DOES NOT FIT); "
        "bound (compute at peak): step >= 3.79 s, MFU <= 42.0%"
    )
    assert row["planned_peak_gb"] == 3.2 and row["est_total_gb"] == 2.5 and row["est_activations_gb"] == 1.5
    assert main(["report", str(tmp_path)]) == 0
    assert "0 (planned): plan=true: nothing launched" in capsys.readouterr().out


def test_a_plan_file_with_a_key_of_the_wrong_type_is_named_and_skipped(tmp_path, capsys):
    cell = tmp_path / "0"
    cell.mkdir()
    plan = plan_config(compose_config("model=tiny")).record().to_dict()
    plan["time"]["step_s"] = "fast"
    (cell / "plan.json").write_text(json.dumps(plan))
    (row,) = report_json(tmp_path, capsys=capsys)
    assert row["status"] == "unreadable"
    assert row["error"] == (
        f"{cell / 'plan.json'}: unreadable ({cell / 'plan.json'}: key 'time.step_s' is 'fast', expected a "
        f"number or null; move {cell / 'plan.json'} aside (the run's other files stay readable) or plan the "
        "cell again)"
    )


def test_a_half_written_metrics_line_is_skipped(tmp_path, capsys):
    run = write_cell(tmp_path / "run", losses=LOSSES[:3], write_summary=False)
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 3, "lo')
    (row,) = report_json(run, capsys=capsys)
    assert row["steps"] == 3
    assert row["final_loss"] == LOSSES[2]


def test_failure_records_give_the_error_when_the_summary_has_none(tmp_path, capsys):
    run = write_cell(tmp_path / "run", write_summary=False)
    (run / "failure_rank1.json").write_text(json.dumps({"rank": 1, "error": "ValueError: bad shard"}))
    (row,) = report_json(run, capsys=capsys)
    assert row["status"] == "failed"
    assert row["error"] == "rank 1: ValueError: bad shard"


def test_several_paths_and_nested_multirun_directories(tmp_path, capsys):
    write_cell(tmp_path / "multirun" / "2026-11-29" / "12-00-00" / "0")
    write_cell(tmp_path / "multirun" / "2026-11-29" / "12-00-00" / "1", gpus=2)
    write_cell(tmp_path / "outputs" / "single", gpus=2, parallel="zero3")
    rows = report_json(tmp_path / "multirun", tmp_path / "outputs" / "single", capsys=capsys)
    assert sorted(r["cell"] for r in rows) == [
        "multirun/2026-11-29/12-00-00/0",
        "multirun/2026-11-29/12-00-00/1",
        "outputs/single",
    ]


def test_numbered_cells_sort_numerically(tmp_path):
    for n in (0, 2, 10):
        write_cell(tmp_path / "sweep" / str(n))
    assert [c.cell_id for c in collect([tmp_path / "sweep"])] == ["0", "2", "10"]


def test_memory_terms_come_from_summary_or_else_from_metrics(tmp_path, capsys):
    terms = ("params", "grads", "optimizer", "activations")
    memory = {
        "device_memory_gb": 80.0,
        "estimated": {f"{t}_gb": 1.0 + i for i, t in enumerate(terms)} | {"total_gb": 10.0},
        "measured": {f"{t}_gb": 1.5 + i for i, t in enumerate(terms)}
        | {"peak_gb": 12.0, "residual": {"nccl": 0.5}},
    }
    write_cell(tmp_path / "a", memory=memory, peak_gb=12.0)
    logged = {f"memory/est/{t}_gb": 0.25 for t in terms} | {f"memory/measured/{t}_gb": 0.5 for t in terms}
    write_cell(tmp_path / "b", extra_metrics=logged, peak_gb=2.5)
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert rows["a"]["est_optimizer_gb"] == 3.0 and rows["a"]["measured_activations_gb"] == 4.5
    assert rows["a"]["est_total_gb"] == 10.0 and rows["a"]["device_memory_gb"] == 80.0
    assert rows["a"]["measured_residual_gb"] == 0.5
    assert rows["b"]["est_params_gb"] == 0.25 and rows["b"]["measured_grads_gb"] == 0.5
    assert rows["b"]["est_total_gb"] == 1.0
    assert rows["b"]["measured_residual_gb"] == pytest.approx(2.5 - 4 * 0.5)  # peak - measured terms


def test_each_cell_shows_where_its_step_time_goes(tmp_path, capsys):
    phases = {
        "time/step_s": 2.0,
        "time/forward_s": 0.6,
        "time/backward_s": 1.2,
        "time/optimizer_s": 0.2,
        "time/comm_exposed_s": 0.1,
    }
    write_cell(tmp_path / "a", extra_metrics=phases)
    write_cell(tmp_path / "b")  # a run from before the phases were logged
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert rows["a"]["time_forward_pct"] == pytest.approx(30)
    assert rows["a"]["time_backward_pct"] == pytest.approx(60)
    assert rows["a"]["time_optimizer_pct"] == pytest.approx(10)
    assert rows["a"]["time_comm_exposed_pct"] == pytest.approx(5)
    assert rows["b"]["time_forward_pct"] is None
    assert main(["report", str(tmp_path), "--wide"]) == 0
    out = capsys.readouterr().out
    assert "30 / 60 / 10 / 5 / –" in out  # no pipeline: no stage-to-stage time


def test_a_pipeline_cell_shows_its_stage_to_stage_share_and_chart_segment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the wide table on one line, however long tmp_path's name
    phases = {
        "time/step_s": 2.0,
        "time/forward_s": 0.5,
        "time/backward_s": 0.9,
        "time/p2p_s": 0.4,
        "time/optimizer_s": 0.2,
        "time/comm_exposed_s": 0.0,
    }
    write_cell(tmp_path / "pp", extra_metrics=phases)
    write_cell(tmp_path / "plain", extra_metrics={k: v for k, v in phases.items() if "p2p" not in k})
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert rows["pp"]["time_p2p_pct"] == pytest.approx(20)
    assert rows["plain"]["time_p2p_pct"] is None
    assert main(["report", str(tmp_path), "--wide"]) == 0
    assert "25 / 45 / 10 / 0 / 20" in capsys.readouterr().out
    chart = time_chart(build_rows(collect([tmp_path])))
    assert "p2p" in {item.name for item in chart.legend}


def test_a_calibrated_plan_shows_its_predicted_step_and_the_bound_beside_it(tmp_path, capsys):
    cell = tmp_path / "0"
    (cell / ".hydra").mkdir(parents=True)
    (cell / ".hydra" / "config.yaml").write_text("gpus: 1\n")
    planned = plan_config(compose_config("model=tiny")).record()
    time = replace(
        planned.time,
        step_s=0.273,
        step_s_is_lower_bound=False,
        mfu=0.751,
        bound_step_s=0.205,
        bound_mfu=1.0,
        calibration="here",
    )
    write_plan(cell, replace(planned, time=time))
    (row,) = report_json(tmp_path, capsys=capsys)
    assert row["error"] == (
        f"plan=true: nothing launched; planned peak {planned.memory_bytes.peak / 1e9:.3g} GB per device "
        "(FITS); "
        "predicted step 0.273 s, MFU 75.1%; bound (compute at peak): step 0.205 s, MFU <= 100.0%"
    )
    assert row["predicted_step_s"] == 0.273 and row["step_s"] is None


def test_the_predicted_step_stands_beside_the_measured_in_every_format(tmp_path, capsys):
    """summary.json's step_time (the plan's prediction, recorded at launch) beside the measured
    median step: a column "pred step s" next to "step s" in Markdown and on the page."""
    run = write_cell(tmp_path / "run", extra_metrics={"time/step_s": 0.5})
    summary = json.loads((run / "summary.json").read_text())
    summary["step_time"] = {"predicted_s": 0.4, "measured_s": 0.5, "error": -0.2}
    (run / "summary.json").write_text(json.dumps(summary))
    (row,) = report_json(run, capsys=capsys)
    assert row["predicted_step_s"] == 0.4 and row["step_s"] == 0.5
    assert main(["report", str(run), "--format", "md"]) == 0
    header, _, line = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    cells = [cell.strip() for cell in header.split("|")]
    at = cells.index("step s")
    assert cells[at + 1] == "pred step s"
    assert [cell.strip() for cell in line.split("|")][at : at + 2] == ["0.5", "0.4"]
    page = tmp_path / "report.html"
    assert main(["report", str(run), "--html", str(page), "--format", "csv"]) == 0
    html = page.read_text()  # one "step s" header over its measured and predicted columns
    assert '<th colspan="2" class="group">step s</th>' in html and "<th>pred</th>" in html


def test_markdown_and_csv_list_every_cell(tmp_path, capsys):
    sweep = write_sweep(tmp_path)
    assert main(["report", str(sweep), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["cell"] for r in rows] == ["0", "1", "2", "3"]
    assert rows[1]["mfu"] == "0.45" and rows[1]["peak_gb"] == "0.6"
    assert main(["report", str(sweep), "--format", "md"]) == 0
    markdown = capsys.readouterr().out
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 4  # header, rule, one line per cell
    assert "| 45.0 |" in table[3]  # MFU in %
    assert "`2` (failed): rank 1: RuntimeError: CUDA out of memory" in markdown


def test_the_terminal_table_marks_the_best_and_lists_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # piped, as to a file: tables keep their width
    assert main(["report", str(write_sweep(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "★ MFU, peak" in out
    assert "GB = 1e9 bytes" in out
    assert "2 (failed): rank 1: RuntimeError: CUDA out of memory" in out
    assert "3 (missing)" in out
    assert "loss curves: model tiny, global batch 16: the loss curves of 3 cells coincide" in out


def test_a_missing_path_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert f"no such file or directory: {tmp_path / 'nowhere'}" in err


def test_a_directory_without_runs_is_refused(tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no run directory" in capsys.readouterr().err


def test_html_into_a_missing_directory_is_refused(tmp_path, capsys):
    run = write_cell(tmp_path / "run")
    assert main(["report", str(run), "--html", str(tmp_path / "no" / "page.html")]) == 2
    assert "no such directory for --html" in capsys.readouterr().err


def test_expected_sweep_enumerates_jobs_in_hydras_order():
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = ["parallel=ddp,zero2,zero3", "gpus=1,2", "train.steps=8"]
    multirun = {
        "hydra": {
            "sweep": {"subdir": "${hydra.job.num}"},
            "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"},
            "overrides": {"task": task},
        }
    }
    parsed = OverridesParser.create().parse_overrides(task)
    (hydras,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    assert expected_sweep(multirun) == hydras
    assert len(hydras) == 6


def test_loss_curves_coincide_within_tolerance_or_are_reported_apart(tmp_path):
    write_cell(tmp_path / "a")
    write_cell(tmp_path / "b", gpus=2, losses=[x + 1e-5 for x in LOSSES])
    off = [*LOSSES[:5], LOSSES[5] + 0.2, *LOSSES[6:]]
    write_cell(tmp_path / "c", parallel="zero3", gpus=2, losses=off)
    write_cell(tmp_path / "d", global_size=32, losses=[x + 1 for x in LOSSES])  # another experiment
    cells = collect([tmp_path])
    same = loss_agreement([c for c in cells if c.cell_id in ("a", "b")])
    assert len(same) == 1 and same[0].coincide is True
    assert same[0].max_spread == pytest.approx(1e-5)
    assert same[0].tolerance == 1e-3
    groups = {a.global_size: a for a in loss_agreement(cells)}
    assert groups[16].coincide is False
    assert groups[16].worst_step == 5 and groups[16].max_spread == pytest.approx(0.2)
    assert "DIFFER" in groups[16].verdict()
    assert groups[32].coincide is None  # one cell: nothing to compare
    assert loss_agreement(cells, tolerance=0.5)[0].coincide is True


def test_bf16_cells_get_the_looser_default_tolerance(tmp_path):
    write_cell(tmp_path / "a", precision="bf16")
    write_cell(tmp_path / "b", precision="bf16", losses=[x + 0.01 for x in LOSSES])
    (agreement,) = loss_agreement(collect([tmp_path]))
    assert agreement.tolerance == 5e-2 and agreement.coincide is True


def test_config_diff_names_the_keys_that_differ(tmp_path):
    write_cell(tmp_path / "a", parallel="ddp", gpus=1)
    write_cell(tmp_path / "b", parallel="zero2", gpus=2)
    diff = config_diff(collect([tmp_path]))
    assert set(diff.differing) == {"parallel.name", "parallel.zero_stage", "gpus"}
    assert diff.differing["gpus"] == {"a": 1, "b": 2}
    assert diff.same == 8


def test_the_page_is_self_contained_and_has_every_chart(tmp_path, capsys):
    sweep = write_sweep(tmp_path)
    page_path = tmp_path / "report.html"
    assert main(["report", str(sweep), "--html", str(page_path), "--format", "csv"]) == 0
    page = page_path.read_text()
    # no fetch of any kind: no external script, stylesheet, image or font
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", page)
    assert "@import" not in page and "url(" not in page
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}  # a namespace
    assert "default-src 'none'" in page
    charts = re.findall(r'<figure class="chart" data-chart="(\w+)" data-empty="(\w+)"', page)
    assert charts == [
        ("memory", "false"),
        ("time", "false"),
        ("wall", "true"),  # these cells are from before wall_time was recorded
        ("mfu", "false"),
        ("tokens", "false"),
        ("loss", "false"),
        ("spread", "false"),
    ]
    assert page.count('class="mark"') > 20
    assert "the loss curves of 3 cells coincide" in page
    assert "RuntimeError: CUDA out of memory" in page
    assert "<th>parallel.name</th><td>ddp</td><td>ddp</td><td>zero2</td></tr>" in page  # cells 0, 1, 2


def test_rows_of_cells_keep_every_cell(tmp_path):
    sweep = write_sweep(tmp_path)
    rows = build_rows(collect([sweep]))
    assert {r.status for r in rows} == {"completed", "failed", "missing"}


@pytest.mark.parametrize(("lo", "hi"), [(0, 0.85), (0, 80), (3.1, 5.2), (0, 1e-6), (0, 0)])
def test_axis_ticks_cover_the_data_in_round_steps(lo, hi):
    ticks = nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi
    steps = {round(b - a, 12) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1
    mantissa = f"{steps.pop():e}".split("e")[0]
    assert float(mantissa) in (1.0, 2.0, 2.5, 5.0)


def test_the_peak_the_plan_put_on_the_device_shows_beside_the_measured(tmp_path, capsys):
    """A run records its plan's device peak at launch (summary.json ``device_memory_plan``);
    the memory table shows it as a third line, ``plan``, under the measured peak."""
    planned = write_cell(tmp_path / "planned", peak_gb=12.0)
    summary = json.loads((planned / "summary.json").read_text())
    summary["device_memory_plan"] = {"planned_peak_gb": 11.5, "fits": True}
    (planned / "summary.json").write_text(json.dumps(summary))
    write_cell(tmp_path / "older", peak_gb=2.5)  # a run from before plans were recorded
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert rows["planned"]["planned_peak_gb"] == 11.5 and rows["older"]["planned_peak_gb"] is None
    assert main(["report", str(tmp_path), "--wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    plan_lines = [line.split() for line in lines if line.split()[:1] == ["plan"]]
    assert plan_lines == [["plan", "11.5"]]
    # The page's memory chart: a third bar for the planned cell only.
    chart = memory_chart(build_rows(collect([tmp_path])))
    assert "planned peak" in {item.name for item in chart.legend}
    assert chart.svg.count("planned peak 11.5 GB") == 1


def test_a_run_resumed_onto_another_layout_says_which_layouts_it_trained_on(tmp_path, capsys):
    """summary.json's ``layout_history``: the terminal, Markdown, JSON and the page name each
    layout and the step it began at (the row's figures are the last layout's)."""
    moved = write_cell(tmp_path / "moved", parallel="zero3", gpus=2)
    summary = json.loads((moved / "summary.json").read_text())
    layout = {"gpus": 2, "dp": 2, "tp": 1, "pp": 1, "micro_size": 4, "accum_steps": 2, "global_size": 16}
    summary["layout_history"] = [
        {"from_step": 0, "parallel": "ddp", "zero_stage": 0, "precision": "fp32", **layout},
        {"from_step": 3, "parallel": "zero3", "zero_stage": 3, "precision": "fp32", **layout},
    ]
    (moved / "summary.json").write_text(json.dumps(summary))
    write_cell(tmp_path / "stayed")
    said = "layouts: ddp on 2 (dp 2) from step 0 -> zero3 on 2 (dp 2) from step 3"
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert rows["moved"]["layouts"] == said and rows["stayed"]["layouts"] is None
    assert main(["report", str(tmp_path)]) == 0
    assert f"moved: {said}" in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--format", "md"]) == 0
    assert f"- `moved`: {said}" in capsys.readouterr().out
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path), "--html", str(page)]) == 0
    assert "Cells resumed onto another layout" in page.read_text() and "-&gt; zero3 on 2" in page.read_text()


def test_each_cell_shows_where_its_wall_time_went(tmp_path, capsys):
    """summary.json's ``wall_time``: the wall column (total and the steps' share), the flat fields,
    and the terminal's table of parts; a run from before it was recorded shows a dash."""
    timed = write_cell(tmp_path / "timed")
    summary = json.loads((timed / "summary.json").read_text())
    summary["wall_time"] = {
        "total_s": 20.0,
        "launch_s": 4.0,
        "build_s": 1.0,
        "engine_s": 2.0,
        "resume_s": 0.0,
        "setup_s": 1.0,
        "steps_s": 10.0,
        "checkpoint_s": 1.5,
        "checkpoints": 3,
        "checkpoint_gb": 0.3,
        "checkpoint_gb_per_s": 0.2,
        "other_s": 0.5,
        "steps_share": 0.5,
    }
    (timed / "summary.json").write_text(json.dumps(summary))
    write_cell(tmp_path / "older")
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert (rows["timed"]["wall_total_s"], rows["timed"]["wall_steps_share"]) == (20.0, 0.5)
    assert rows["timed"]["wall_checkpoints"] == 3 and rows["older"]["wall_total_s"] is None
    assert main(["report", str(tmp_path), "--format", "md"]) == 0
    assert "| 20.0 (50%) |" in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (timed_line,) = [line.split() for line in lines if line.split()[:2] == ["timed", "20.0"]]
    # total, launch, build, engine, setup, steps, ckpt, other (no resume: none loaded), steps%, saves, GB/s
    assert timed_line[1:] == ["20.0", "4.0", "1.0", "2.0", "1.0", "10.0", "1.5", "0.5", "50", "3", "0.20"]


def test_a_cell_of_several_attempts_shows_its_goodput_across_them(tmp_path, capsys):
    """summary.json's ``goodput`` (runner/metrics/goodput.py): the flat fields, a line under the terminal's
    wall-time table and in the HTML chart's caption; a cell of one attempt shows no such line."""
    restarted = write_cell(tmp_path / "restarted")
    summary = json.loads((restarted / "summary.json").read_text())
    summary["wall_time"] = {"total_s": 20.0, "steps_s": 10.0, "steps_share": 0.5}
    attempt = {"status": "completed", "from_step": 0, "to_step": 8}
    summary["goodput"] = {
        "attempts": [attempt, attempt],
        "wall_s": 40.0,
        "between_attempts_s": 5.0,
        "kept_s": 18.0,
        "lost_s": 2.0,
        "steps_lost": 3,
        "goodput": 0.45,
        "goodput_elapsed": 0.4,
    }
    (restarted / "summary.json").write_text(json.dumps(summary))
    once = write_cell(tmp_path / "once")
    summary = json.loads((once / "summary.json").read_text())
    summary["wall_time"] = {"total_s": 9.0, "steps_s": 6.0, "steps_share": 0.67}
    summary["goodput"] = {"attempts": [attempt], "wall_s": 9.0, "kept_s": 6.0, "goodput": 0.67}
    (once / "summary.json").write_text(json.dumps(summary))
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert (rows["restarted"]["attempts"], rows["restarted"]["goodput"], rows["restarted"]["steps_lost"]) == (
        2,
        0.45,
        3,
    )
    assert rows["once"]["attempts"] == 1
    said = (
        "restarted: goodput over 2 attempts: 45% (18.0 s of kept steps in 40.0 s of attempts); "
        "3 steps trained again (2.0 s); 5.0 s between attempts"
    )
    assert main(["report", str(tmp_path), "--wide"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert said in out and "once: goodput" not in out
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path), "--html", str(page)]) == 0
    assert "Cell restarted, goodput over 2 attempts: 45%" in page.read_text()


def test_an_evaluated_cell_shows_its_held_out_loss_and_evaluation_time(tmp_path, capsys, monkeypatch):
    """summary.json's ``eval`` (runner/train/evaluation.py): the flat field, an ``eval`` column beside the
    final loss, and an ``eval`` part in the wall-time table; cells without stay as they were."""
    monkeypatch.delenv("COLUMNS", raising=False)  # piped, as to a file: tables keep their width
    evaluated = write_cell(tmp_path / "evaluated")
    summary = json.loads((evaluated / "summary.json").read_text())
    summary["eval"] = {"loss": 3.25, "step": 8, "every": 4, "sequences": 64}
    wall = {"total_s": 20.0, "steps_s": 10.0, "eval_s": 2.5, "evaluations": 2, "other_s": 0.5}
    summary["wall_time"] = {**wall, "steps_share": 0.5}
    (evaluated / "summary.json").write_text(json.dumps(summary))
    write_cell(tmp_path / "plain")
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert (rows["evaluated"]["eval_loss"], rows["plain"]["eval_loss"]) == (3.25, None)
    assert rows["evaluated"]["wall_eval_s"] == 2.5
    assert main(["report", str(tmp_path), "--wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("3.2500" in line for line in lines)
    (header,) = [line.split() for line in lines if line.split()[:2] == ["cell", "total"]]
    assert header[header.index("steps") + 2] == "eval"  # steps, ckpt, eval, other
    assert main(["report", str(tmp_path / "plain"), "--wide"]) == 0
    assert " eval " not in capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal shortens names and headers, never numbers
    assert main(["report", str(tmp_path), "--wide"]) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in narrow) <= 80
    losses = [line.split()[-3:-1] for line in narrow if "3.2500" in line]
    assert losses == [["3.2500", "3.2500"], ["3.2500", "–"]]  # the final loss, the eval loss if any


def test_held_out_loss_curves_are_compared_among_cells_that_evaluated_the_same_batches(tmp_path, capsys):
    """The held-out loss is compared as the loss is, within a group that also read the same held-out
    batches of the same tokens: a cell evaluated on more batches is another comparison."""

    def evaluated(name: str, eval_loss: float, eval_batches: int = 4, **kwargs: Any) -> None:
        run_dir = write_cell(tmp_path / name, extra_metrics={"eval/loss": eval_loss}, **kwargs)
        config_file = run_dir / ".hydra" / "config.yaml"
        config = yaml.safe_load(config_file.read_text())
        config["train"] = {"eval_batches": eval_batches}
        config_file.write_text(yaml.safe_dump(config))

    evaluated("a", 3.0)
    evaluated("b", 3.0 + 2e-6, gpus=2, parallel="zero3")
    evaluated("c", 3.5, gpus=2, eval_batches=8)
    write_cell(tmp_path / "plain")  # never evaluated: compared on its training loss only
    cells = collect([tmp_path])
    groups = {a.held_out: a for a in loss_agreement(cells, metric="eval/loss")}
    assert set(groups) == {"4 batches of built-in", "8 batches of built-in"}
    same = groups["4 batches of built-in"]
    assert (same.cell_ids, same.coincide) == (["a", "b"], True)
    assert same.max_spread == pytest.approx(2e-6)
    assert groups["8 batches of built-in"].coincide is None
    assert main(["report", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "held-out loss curves: model tiny, global batch 16, held out: 4 batches of built-in: " in out
    assert "the held-out loss curves of 2 cells coincide" in out
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path), "--html", str(page)]) == 0
    assert "Held-out loss curves of all cells" in page.read_text()
    assert main(["report", str(tmp_path / "plain"), "--html", str(page)]) == 0
    assert "Held-out loss" not in page.read_text()  # no cell evaluated: no such chart


def test_goodput_comes_from_attempts_jsonl_where_the_last_attempt_was_killed(tmp_path, capsys):
    """A run whose latest attempt was killed outright has a summary from the attempt before; the
    report reads attempts.jsonl, which holds both."""
    run_dir = write_cell(tmp_path / "killed", status="running")
    events = [
        {"attempt": 0, "event": "start", "started": 0.0, "time": 3.0, "from_step": 0},
        {"attempt": 0, "event": "end", "time": 20.0, "status": "interrupted", "step": 10, "steps_s": 12.0},
        {"attempt": 1, "event": "start", "started": 30.0, "time": 33.0, "from_step": 10},
        {"attempt": 1, "event": "progress", "time": 40.0, "step": 14, "steps_s": 5.0},
    ]
    (run_dir / "attempts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rows = {r["cell"]: r for r in report_json(tmp_path, capsys=capsys)}
    assert (rows["killed"]["attempts"], rows["killed"]["steps_lost"]) == (2, 0)
    assert rows["killed"]["goodput"] == pytest.approx(17.0 / 30.0)


def test_a_cell_whose_step_times_spread_wide_is_flagged_noisy_in_every_view(tmp_path, capsys, monkeypatch):
    """summary.json's step_time_spread, or for a cell without one the logged steps' times: above 25% of
    the median, the JSON, the terminal and the page flag the cell."""
    quiet = write_cell(tmp_path / "sweep" / "0")
    summary = json.loads((quiet / "summary.json").read_text())
    summary["step_time_spread"] = {"iqr_over_median": 0.04, "noisy": False, "steps": 7}
    (quiet / "summary.json").write_text(json.dumps(summary))
    # No summary: the logged steps' times say it (step 0's warm-up left out).
    shared = [{"time/step_s": s} for s in (3.0, 0.5, 1.0, 0.5, 1.1, 0.5, 0.9, 0.5)]
    write_cell(tmp_path / "sweep" / "1", write_summary=False, extra_metrics=None)
    lines = (tmp_path / "sweep" / "1" / "metrics.jsonl").read_text().splitlines()
    merged = [json.dumps({**json.loads(line), **t}) for line, t in zip(lines, shared, strict=True)]
    (tmp_path / "sweep" / "1" / "metrics.jsonl").write_text("\n".join(merged) + "\n")
    rows = report_json(tmp_path / "sweep", capsys=capsys)
    assert [(r["step_iqr_over_median"], r["noisy"]) for r in rows] == [
        (0.04, False),
        (pytest.approx(0.9), True),
    ]
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["report", str(tmp_path / "sweep"), "--wide"]) == 0
    out = capsys.readouterr().out
    assert "90 noisy" in out and "noisy: cell 1: the step times' IQR is above 25% of their median" in out
    page_path = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "sweep"), "--html", str(page_path), "--format", "csv"]) == 0
    assert '<td class="num noisy">90 noisy</td>' in page_path.read_text()


def test_the_loss_charts_and_verdicts_count_steps_from_one_as_the_console_does(tmp_path):
    write_cell(tmp_path / "sweep" / "0", losses=[5.0, 4.0, 3.0])
    write_cell(tmp_path / "sweep" / "1", losses=[5.0, 4.0, 3.5])
    cells = collect([tmp_path / "sweep"])
    chart = loss_chart(cells, ["0", "1"], {})
    assert "<title>0: 1, 5</title>" in chart.svg and "<title>0: 3, 3</title>" in chart.svg
    assert ": 0, " not in chart.svg  # no point at step 0
    (agreement,) = loss_agreement(cells)
    assert "max |Δloss| 5.00e-01 at step 3 over 3 common steps" in agreement.verdict()


def test_on_a_cpu_the_measured_bar_reaches_the_measured_peak(tmp_path):
    """The terms and DeepSpeed's named buffers come to 0.15 GB; the high-water RSS, the peak, is 0.62 GB:
    the bar goes on to it, the rest named for what it is."""
    terms = {"params_gb": 0.013, "grads_gb": 0.013, "optimizer_gb": 0.026, "activations_gb": 0.096}
    memory = {
        "estimated": {**terms, "total_gb": 0.148},
        "measured": {**terms, "peak_gb": 0.62, "residual": {"model_buffers_gb": 0.001}},
    }
    run = write_cell(tmp_path / "run", memory=memory, peak_gb=0.62)
    summary = json.loads((run / "summary.json").read_text())
    summary["peak_memory_measure"] = "process high-water RSS (the CPU device: the host's memory)"
    (run / "summary.json").write_text(json.dumps(summary))
    chart = memory_chart(build_rows(collect([run])))
    assert "rest of peak 0.471 GB (torch" in chart.svg and "the process's high-water RSS" in html.unescape(
        chart.svg
    )
    assert "rest of peak" in {item.name for item in chart.legend}


def test_the_default_table_fits_120_columns_and_wide_shows_every_column(tmp_path, capsys, monkeypatch):
    """Piped or on a 120-column terminal, the report fits, the most telling columns first, and its
    legend is one short line per column; --wide has the layout, step phases, memory and wall parts."""
    monkeypatch.delenv("COLUMNS", raising=False)  # piped, as to a file
    sweep = write_sweep(tmp_path)
    assert main(["report", str(sweep)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    (header,) = [line.split() for line in lines if line.split()[:2] == ["cell", "overrides"]]
    assert header[2:5] == ["tok/s/dev", "MFU", "%"]  # speed first, after what the cell is
    assert not any(word in " ".join(lines) for word in ("dp·tp·pp", "fwd/bwd/opt/comm/p2p", "est / meas"))
    assert any(line.startswith("MFU %: model FLOP/s per device") for line in lines)  # its own line
    assert "--wide" in lines[-1] or any("--wide:" in line for line in lines)
    console = Console(width=120, record=True, file=io.StringIO())
    print_report(build_rows(collect([sweep])), [], console=console, title="ladder report")
    assert max(len(line) for line in console.export_text().splitlines()) <= 120
    assert main(["report", str(sweep), "--wide"]) == 0
    wide = capsys.readouterr().out
    for header in ("dp·tp·pp", "fwd/bwd/opt/comm/p2p %", "micro", "accum", "memory per device", "wall time"):
        assert header in wide, header


@pytest.mark.parametrize(
    ("malformed", "words"),
    [
        ({"steps_completed": "eight"}, "key 'steps_completed' is 'eight'"),
        ({"memory": [0.1, 0.2]}, "key 'memory' is [0.1, 0.2], expected a JSON object or null"),
    ],
)
def test_a_malformed_summary_is_skipped_and_named_while_the_other_cells_are_reported(
    tmp_path, capsys, malformed, words
):
    sweep = write_sweep(tmp_path)
    (sweep / "0" / "summary.json").write_text(json.dumps({"status": "completed", **malformed}))
    rows = report_json(sweep, capsys=capsys)
    by_cell = {r["cell"]: r for r in rows}
    assert sorted(by_cell) == ["0", "1", "2", "3"]
    assert by_cell["0"]["status"] == "unreadable"
    assert words in by_cell["0"]["error"] and str(sweep / "0" / "summary.json") in by_cell["0"]["error"]
    assert by_cell["1"]["status"] == "completed" and by_cell["2"]["status"] == "failed"
    assert main(["report", str(sweep), "--format", "csv"]) == 0
    said = capsys.readouterr().err
    assert "skipped the summary of 0" in said and str(sweep / "0" / "summary.json") in said
