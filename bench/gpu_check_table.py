"""The table and results.json of bench/gpu_check.sh: measured runs beside their plans."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
from pathlib import Path
from typing import Any

PHASES = ("forward", "backward", "optimizer")
LAYOUTS = ("ddp", "zero1", "zero3", "largest", "zero1_compiled", "zero3_micro1", "recommended")
RECOMMEND_PLAN = "plan_recommend"  # the recommended run's plan: plan.json's "recommendation"


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def _row(out: Path, name: str) -> dict[str, Any]:
    run, plan = out / f"run_{name}", out / f"plan_{name}"
    summary = _read(run / "summary.json")
    metrics_path = run / "metrics.jsonl"
    metrics = (
        [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    )
    later = metrics[1:] or metrics  # the first step holds allocation and warm-up
    memory = summary.get("memory", {})
    planned = _read(plan / "plan.json")
    if name == "recommended":  # planned as the winner of planner.recommend's ranking
        planned = (_read(out / RECOMMEND_PLAN / "plan.json").get("recommendation") or {}).get("winner") or {}
    # The calibrated step-time model's prediction beside the run's median step after warm-up
    # (runner/train/attempt_end.py measured_step_time; error = (predicted - measured) / measured).
    step_time = summary.get("step_time") or {}
    return {
        "layout": name,
        "model": summary.get("model"),
        "parallel": summary.get("parallel"),
        "status": summary.get("status", "missing"),
        "micro_size": summary.get("layout", {}).get("micro_size"),
        "tokens_per_s_per_device": _median([m["throughput/tokens_per_s_per_device"] for m in later]),
        "mfu": _median([m["throughput/mfu"] for m in later]),
        "predicted_step_s": step_time.get("predicted_s"),
        "measured_step_s": step_time.get("measured_s"),
        "step_time_error": step_time.get("error"),
        "step_time": step_time,
        # Where the step's time goes (runner/metrics/phase_clock.py), as shares of the step.
        "step_share": {
            phase: _median([m[f"time/{phase}_s"] / m["time/step_s"] for m in later if f"time/{phase}_s" in m])
            for phase in PHASES
        },
        "peak_gb": summary.get("final", {}).get("memory/peak_gb"),
        # CUDA's allocator: reserved bytes, retries and OOMs (fragmentation near the limit).
        "cuda_allocator": summary.get("cuda_allocator", {}),
        "ledger_estimated_gb": memory.get("estimated", {}).get("total_gb"),
        "ledger_measured": memory.get("measured"),
        "planned": planned,
        "peak_flops_source": summary.get("peak_flops_source"),
        # How rank 0 built the model and what the build cost its host (runner/engine/build.py).
        "model_build": summary.get("model_build", {}),
        # A rank's host memory: the plan's per-rank figure and the process's high-water mark.
        "host_memory": summary.get("host_memory", {}),
        # Where the run's wall time went: CUDA's start-up, the engine, the steps
        # (runner/metrics/wall_clock.py).
        "wall_time": summary.get("wall_time", {}),
        # The held-out loss after the last step (ddp, zero1, zero3 only): one experiment, one number.
        "eval_loss": (summary.get("eval") or {}).get("loss"),
    }


def _shares(step_share: dict[str, float | None]) -> str:
    return " / ".join("-" if share is None else f"{100 * share:.0f}" for share in step_share.values())


def _host_plan_and_run(host_memory: dict[str, Any]) -> str:
    planned, measured = host_memory.get("planned_per_rank_gb"), host_memory.get("measured_per_rank_gb")
    return " / ".join("-" if gb is None else f"{gb:.2f}" for gb in (planned, measured))


def _timings(out: Path) -> list[dict[str, Any]]:
    """Each part's wall seconds and exit status, as gpu_check.sh recorded them (timings.tsv)."""
    path = out / "timings.tsv"
    if not path.exists():
        return []
    parts = [line.split("\t") for line in path.read_text().splitlines() if line.count("\t") == 2]
    # A part skipped for want of time (GPU_CHECK_BUDGET_S) has "skipped" for its status.
    return [
        {"part": name, "seconds": int(seconds), "exit_status": int(rc) if rc.isdigit() else rc}
        for name, seconds, rc in parts
    ]


def _wall(wall: dict[str, Any]) -> str:
    """The run's wall seconds and the steps' share of them, e.g. ``41 (62%)``."""
    total, share = wall.get("total_s"), wall.get("steps_share")
    if total is None:
        return "-"
    return f"{total:.0f}" + ("" if share is None else f" ({100 * share:.0f}%)")


def _label(row: dict[str, Any]) -> str:
    """The row's name; the largest model's with the layout it was planned and run under."""
    return f"largest/{row['parallel']}" if row["layout"] == "largest" and row["parallel"] else row["layout"]


def _seconds(value: float | None, width: int) -> str:
    return f"{value:>{width}.3f}" if value is not None else f"{'-':>{width}}"


def _time_model_line(rows: list[dict[str, Any]]) -> str:
    """The step-time model's accuracy over the runs that have both a prediction and a measurement."""
    errors = sorted(abs(row["step_time_error"]) for row in rows if row["step_time_error"] is not None)
    if not errors:
        return "time model: no run has both a predicted and a measured step"
    median = statistics.median(errors)
    return (
        f"time model: median |error| {100 * median:.1f}%, max {100 * errors[-1]:.1f}% over {len(errors)} runs"
    )


def _recommendation(out: Path) -> dict[str, Any]:
    """What planner.recommend chose (the recommend part's plan.json), without the whole ranking."""
    record = _read(out / RECOMMEND_PLAN / "plan.json").get("recommendation") or {}
    ranking = record.get("ranking") or []
    return {
        "winner_rung": record.get("winner_rung"),
        "winner_rank": record.get("winner_rank"),
        "overrides": record.get("overrides"),
        "command": record.get("command"),
        "top": [
            {
                key: candidate.get(key)
                for key in ("rank", "rung", "tokens_per_s", "step_s", "mfu", "overrides")
            }
            for candidate in ranking[:5]
        ],
    }


def _planned_total_gb(planned: dict[str, Any]) -> float | None:
    memory = planned.get("memory_bytes", {})
    total = memory.get("peak", memory.get("total"))
    return None if total is None else total / 1e9


# The speed benches' verdict lines, kept from their logs: (part, log file, line prefix).
BENCH_LINES = (("peer", "peer.log", "ratio="), ("copies", "copies.log", "opt_ratio "))


def _bench_lines(out: Path) -> dict[str, list[str]]:
    """Each speed bench's verdict lines (bench/peer_gpu.py's ratios, bench/lean_zero_step_speed.py's
    opt_ratio), for the parts that ran."""
    found: dict[str, list[str]] = {}
    for part, name, prefix in BENCH_LINES:
        log = out / name
        if log.is_file():
            found[part] = [line for line in log.read_text().splitlines() if line.startswith(prefix)]
    return found


def main() -> None:
    """Print the table and write results.json into the output folder."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", default="full")
    args = parser.parse_args()
    import deepspeed
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    rows = [_row(args.out, name) for name in LAYOUTS]
    header = (
        f"{'layout':<15}{'model':<11}{'status':<11}{'micro':>6}{'tok/s/dev':>12}"
        + f"{'pred s':>9}{'step s':>9}{'err %':>8}{'MFU':>8}{'peak GB':>9}"
    )
    print(
        header
        + f"{'ledger est GB':>15}{'plan GB':>9}{'fwd/bwd/opt %':>16}{'build host GB':>15}"
        + f"{'host GB plan/run':>18}{'wall s (steps)':>16}{'eval loss':>11}"
    )
    for row in rows:
        planned = _planned_total_gb(row["planned"])
        cells = [
            f"{_label(row):<15}{row['model'] or '-':<11}{row['status']:<11}{row['micro_size'] or '-':>6}",
            f"{row['tokens_per_s_per_device'] or 0:>12,.0f}",
            _seconds(row["predicted_step_s"], 9),
            _seconds(row["measured_step_s"], 9),
            f"{100 * error:>+8.1f}" if (error := row["step_time_error"]) is not None else f"{'-':>8}",
            f"{(row['mfu'] or 0):>8.1%}",
            f"{row['peak_gb'] or 0:>9.2f}",
            f"{row['ledger_estimated_gb'] or 0:>15.2f}",
            f"{planned if planned is not None else float('nan'):>9.2f}",
            f"{_shares(row['step_share']):>16}",
            f"{row['model_build'].get('host_peak_gb', float('nan')):>15.2f}",
            f"{_host_plan_and_run(row['host_memory']):>18}",
            f"{_wall(row['wall_time']):>16}",
            f"{row['eval_loss']:>11.5f}" if row["eval_loss"] is not None else f"{'-':>11}",
        ]
        print("".join(cells))
    recommendation = _recommendation(args.out)
    if recommendation["command"]:
        print(
            f"recommended (rank {recommendation['winner_rank']} by predicted tok/s): "
            + recommendation["command"]
        )
    timings = _timings(args.out)
    if timings:
        slowest = sorted(timings, key=lambda t: -t["seconds"])[:3]
        print(
            f"wall seconds: {sum(t['seconds'] for t in timings)} in {len(timings)} parts; slowest "
            + ", ".join(f"{t['part']} {t['seconds']}" for t in slowest)
        )
    benches = _bench_lines(args.out)
    for part, lines in benches.items():
        print(f"{part}: " + ("; ".join(lines) or f"no verdict line (see {args.out}/{part}.log)"))
    results = {
        "date": datetime.date.today().isoformat(),
        "mode": args.mode,
        "device": device,
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "rows": rows,
        "recommendation": recommendation,
        "time_model": _time_model_line(rows),
        "timings": timings,
        "benches": benches,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {args.out / 'results.json'}")
    print(results["time_model"])


if __name__ == "__main__":
    main()
