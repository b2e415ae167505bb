"""The step-time model beside every GPU step measured and committed here: one table.

Each measured step is read from where it is committed: a run's own files (metrics.jsonl,
bench/peer_gpu.py's peer.json and log), or a figure quoted in a page of docs/ (the quote is
looked up in that page, so a page edited under the table fails it). Each is planned with
``plan=true``'s planner for ``cluster=h200 gpus=1`` and the run's overrides
(runner/plan/planner.py ``plan_config``, in this process: the h200 calibration file measures
nothing), and printed with the predicted step, the measured one, the error (p - m) / m, and the
calibration figures marked fitted (conf/cluster/calibration/h200.json ``fitted``) whose terms
are in the row. Measurements whose overrides cannot be reconstructed, and steps of programs
other than ladder, are listed under the table, unpredicted.

    python bench/time_model_gpu_table.py            # the table, then median/max error and rank
    python bench/time_model_gpu_table.py --fit      # also the least-squares ZeRO-3 hook figure
    python bench/time_model_gpu_table.py --json rows.json
    python bench/time_model_gpu_table.py --runs gpu_check/ [--cluster h200]   # a new check's runs

``--runs DIR``: instead of the committed steps, the runs ``DIR/run_tm_*`` that bench/gpu_check.sh's
``timemodel`` part wrote (each its median step after the first from metrics.jsonl, its overrides
from Hydra's ``.hydra/overrides.yaml``), planned with their own overrides, or on ``--cluster``'s
calibration file with ``gpus=1`` where one is named. A step run before ``model.loss_tiles``
existed (each committed one; a run whose .hydra/config.yaml lacks the key) formed its loss
whole, and is planned so (``model.loss_tiles=1``).

The last line is ``median_abs_err=<x> max_abs_err=<y> rank_corr=<z>`` over the predicted rows
(relative errors, Spearman's rank correlation), as bench/time_model_accuracy.py prints it.

``--fit``: the ZeRO-3 hook figure that minimises the sum of squared relative errors over the
ZeRO-3 rows, every other term as it is: with ``x`` a row's hook seconds per second of the
figure, ``b`` its other terms and ``m`` its measured step, ``h = sum((x/m)((m - b)/m)) /
sum((x/m)^2)``. The committed ZeRO-3 runs all keep the same tensors persistent (the norm
gains, under ``10 x d_model``), so they cannot split a hook from a gather: the fit holds the
gather figure at what the file says.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEED = "docs/gpu_check/2026-12-04-h200-speed"
# Every run here: one H200, bf16, seq 2048, global batch 16 sequences, synthetic tokens.
BASE = ["cluster=h200", "gpus=1", "precision=bf16", "data.seq_len=2048", "batch.global_size=16"]
LLAMA_1B = [*BASE, "model=llama_1b"]
LLAMA_7B = [*BASE, "model=llama_7b"]
TOKENS = 16 * 2048  # a step's tokens in every run here


@dataclass
class Measured:
    """One measured GPU step: where it is committed, and the overrides that plan it (None: not known)."""

    label: str
    overrides: list[str] | None
    measured_s: float | None
    source: str
    note: str = ""
    # filled by the planner
    predicted_s: float | None = None
    error: float | None = None
    fitted: list[str] = field(default_factory=list)
    zero3: bool = False
    hook_x: float = 0.0  # the row's hook seconds per second of the figure: tensors visited a step
    others_s: float = 0.0  # the row's predicted step less its hook seconds
    # The run formed its loss whole: every step committed here ran before model.loss_tiles existed.
    whole_loss: bool = True


# (label, overrides, figure, unit, page, quote): a figure quoted in a page of docs/. unit:
# "tok/s" (per device), "s" (a step), "mfu" (ladder's MFU, runner/flops.py, over the dense peak).
QUOTED: list[tuple[str, list[str] | None, float, str, str, str]] = [
    (
        "gpu_check ddp 1b m8",
        [*LLAMA_1B, "parallel=ddp", "batch.micro_size=8"],
        48_776,
        "tok/s",
        "docs/benchmarks.md",
        "ddp            llama_1b   completed       8      48,776",
    ),
    (
        "gpu_check zero1 1b m8",
        [*LLAMA_1B, "parallel=zero1", "batch.micro_size=8"],
        48_205,
        "tok/s",
        "docs/benchmarks.md",
        "zero1          llama_1b   completed       8      48,205",
    ),
    (
        "gpu_check zero3 1b m8",
        [*LLAMA_1B, "parallel=zero3", "batch.micro_size=8"],
        43_872,
        "tok/s",
        "docs/benchmarks.md",
        "zero3          llama_1b   completed       8      43,872",
    ),
    (
        "gpu_check zero3 7b m1",
        [*LLAMA_7B, "parallel=zero3", "batch.micro_size=1"],
        3_190,
        "tok/s",
        "docs/benchmarks.md",
        "largest/zero3  llama_7b   completed       1       3,190",
    ),
    (
        "gpu_check zero1 1b m8 compiled",
        [*LLAMA_1B, "parallel=zero1", "batch.micro_size=8", "train.compile=true"],
        60_349,
        "tok/s",
        "docs/benchmarks.md",
        "zero1_compiled llama_1b   completed       8      60,349",
    ),
    (
        "zero3 7b m4 full",
        [*LLAMA_7B, "parallel=zero3", "batch.micro_size=4", "model.activation_checkpointing=full"],
        0.303,
        "mfu",
        "docs/benchmarks-time-model.md",
        "zero3 + full recompute at micro 4 x accum 4\nmeasured 30.3%",
    ),
    (
        "c7e62f8 zero1 1b m8",
        [*LLAMA_1B, "parallel=zero1", "batch.micro_size=8"],
        0.696,
        "s",
        "docs/benchmarks-speed.md",
        "| llama_1b zero1 micro 8 | 0.696 |",
    ),
    (
        "c7e62f8 zero1 1b m8 compiled",
        [*LLAMA_1B, "parallel=zero1", "batch.micro_size=8", "train.compile=true"],
        0.564,
        "s",
        "docs/benchmarks-speed.md",
        "| llama_1b zero1 micro 8, compiled | 0.564 |",
    ),
    (
        "c7e62f8 zero2 1b m4",
        [*LLAMA_1B, "parallel=zero2", "batch.micro_size=4"],
        0.738,
        "s",
        "docs/benchmarks-speed.md",
        "| llama_1b zero2 micro 4 | 0.738 |",
    ),
    (
        "c7e62f8 zero3 7b m8 full",
        [*LLAMA_7B, "parallel=zero3", "batch.micro_size=8", "model.activation_checkpointing=full"],
        4.27,
        "s",
        "docs/benchmarks-speed.md",
        "| llama_7b zero3 micro 8, full recompute | 4.27 |",
    ),
]
# bench/peer_gpu.py's ladder side (runner: parallel=zero1, micro 8 x accum 2, llama_1b).
PEER = [*LLAMA_1B, "parallel=zero1", "batch.micro_size=8"]
# Steps measured on a GPU of programs that are not ladder: no plan predicts them.
NOT_LADDER = [
    (f"{SPEED}/peer.json", "transformers loop, ladder's model in a plain loop (eager, compiled)"),
]


def _quoted(
    label: str, overrides: list[str] | None, figure: float, unit: str, page: str, quote: str
) -> Measured:
    """A figure quoted in a page of docs/, found there (else the table stops: the page changed)."""
    text = " ".join((ROOT / page).read_text().split())
    if " ".join(quote.split()) not in text:
        raise SystemExit(f"time_model_gpu_table: {page} no longer says {quote!r}; update QUOTED")
    step = TOKENS / figure if unit == "tok/s" else figure if unit == "s" else None
    if unit == "mfu":
        return Measured(label, overrides, -figure, page, f"{100 * figure:.1f}% MFU")  # resolved in _plan
    return Measured(label, overrides, step, page)


def _metrics_median(run_dir: Path) -> float:
    """A run's median step after the first (the first holds allocation and warm-up), without the
    step ``train.profile_step`` profiled (the profiler records every operator: a slower step)."""
    summary = run_dir / "summary.json"
    profile = json.loads(summary.read_text()).get("profile") if summary.is_file() else None
    profiled = (profile or {}).get("step")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines if '"time/step_s"' in line]
    return statistics.median(s["time/step_s"] for s in steps[1:] if s.get("step") != profiled)


def _peer_log_steps(path: Path) -> dict[str, float]:
    """bench/peer_gpu.py's printed table: ladder's step seconds by mode (its last column)."""
    steps = {}
    for line in path.read_text().splitlines():
        words = line.split()
        if len(words) > 2 and words[0] in ("eager", "compiled") and words[1] == "ladder":
            steps[words[0]] = float(words[-1])
    return steps


def measurements() -> list[Measured]:
    """Every committed GPU step of ladder, with its source."""
    rows = [_quoted(*quoted) for quoted in QUOTED]
    zero3 = ROOT / SPEED / "run_zero3_micro1"
    rows.append(
        Measured(
            "zero3 7b m1",
            [*LLAMA_7B, "parallel=zero3", "batch.micro_size=1"],
            _metrics_median(zero3),
            f"{SPEED}/run_zero3_micro1/metrics.jsonl",
            "median of steps 2-5",
        )
    )
    peer = json.loads((ROOT / SPEED / "peer.json").read_text())["results"]
    for mode in ("eager", "compiled"):
        overrides = PEER + (["train.compile=true"] if mode == "compiled" else [])
        step = statistics.median(run["step_s"] for run in peer[mode]["ladder"])
        rows.append(Measured(f"peer zero1 1b m8 {mode}", overrides, step, f"{SPEED}/peer.json"))
    first = _peer_log_steps(ROOT / SPEED / "peer-first-run-hf-with-kv-cache.log")
    for mode, step in first.items():
        overrides = PEER + (["train.compile=true"] if mode == "compiled" else [])
        rows.append(
            Measured(
                f"peer first run 1b m8 {mode}",
                overrides,
                step,
                f"{SPEED}/peer-first-run-hf-with-kv-cache.log",
            )
        )
    return rows


def new_runs(folder: Path, cluster: str | None) -> list[Measured]:
    """bench/gpu_check.sh's ``timemodel`` runs in ``folder``: each run's median step after the
    first and the overrides it ran with (on ``cluster``'s calibration, one GPU, where named)."""
    import yaml

    rows = []
    for run in sorted(path for path in folder.glob("run_tm_*") if path.is_dir()):
        metrics, hydra = run / "metrics.jsonl", run / ".hydra" / "overrides.yaml"
        if not metrics.is_file() or not hydra.is_file():
            rows.append(Measured(run.name, None, None, str(run), "no metrics.jsonl or .hydra/overrides.yaml"))
            continue
        skip: tuple[str, ...] = ("hydra.", "train.steps=", "train.eval", "logger=")
        if cluster is not None:
            skip += ("cluster=", "gpus=")
        kept = [o for o in yaml.safe_load(hydra.read_text()) if not o.startswith(skip)]
        overrides = kept + ([f"cluster={cluster}", "gpus=1"] if cluster is not None else [])
        try:
            step = _metrics_median(run)
        except (ValueError, statistics.StatisticsError):
            rows.append(Measured(run.name, None, None, str(metrics), "fewer than two steps"))
            continue
        # A run whose config has model.loss_tiles ran with the rule the planner applies.
        whole = "loss_tiles" not in (run / ".hydra" / "config.yaml").read_text()
        rows.append(
            Measured(run.name.removeprefix("run_tm_"), overrides, step, str(metrics), whole_loss=whole)
        )
    return rows


def _plan(row: Measured) -> None:
    """Plan the row's overrides on cluster=h200 and fill in its prediction."""
    from hydra import compose, initialize_config_dir

    from launchers.compose import register_configs, to_train_config
    from runner.plan.planner import plan_config
    from runner.step_time.estimate import model_flops_per_token

    if row.overrides is None:
        return
    overrides = row.overrides + (["model.loss_tiles=1"] if row.whole_loss else [])
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        config = to_train_config(compose(config_name="config", overrides=overrides))
    plan = plan_config(config)
    time = plan.time
    if row.measured_s is not None and row.measured_s < 0:  # an MFU: the step it implies
        workload = plan.workload
        fpt = model_flops_per_token(workload.model, num_params=workload.num_params, seq_len=workload.seq_len)
        peak = workload.device.peak_flops.value
        assert peak is not None
        row.measured_s = TOKENS * fpt / (-row.measured_s * peak)
    row.predicted_s = time.step_s
    row.zero3 = "parallel=zero3" in row.overrides
    fitted = sorted({name for term in time.terms for name in getattr(term, "fitted", ())})
    row.fitted = fitted
    hook = next((t for t in time.terms if t.name == "zero3 hooks"), None)
    if hook is not None:
        row.hook_x = hook.count  # tensors visited per step: what the hook figure is paid for
    row.others_s = (time.step_s or 0.0) - (hook.seconds if hook is not None else 0.0)
    if row.predicted_s is not None and row.measured_s:
        row.error = (row.predicted_s - row.measured_s) / row.measured_s


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (ties at their mean rank)."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def summary(rows: list[Measured]) -> str:
    """``median_abs_err=... max_abs_err=... rank_corr=...`` over the predicted rows."""
    done = [r for r in rows if r.error is not None and r.predicted_s is not None and r.measured_s is not None]
    errors = [abs(r.error) for r in done if r.error is not None]
    if not errors:
        return "median_abs_err=nan max_abs_err=nan rank_corr=nan"
    rank = spearman([r.predicted_s or 0.0 for r in done], [r.measured_s or 0.0 for r in done])
    return (
        f"median_abs_err={statistics.median(errors):.3f} max_abs_err={max(errors):.3f} "
        f"rank_corr={rank:.3f} rows={len(done)}"
    )


def fit_hooks(rows: list[Measured]) -> tuple[float, list[Measured]] | None:
    """The ZeRO-3 hook figure (seconds a tensor visited and micro-batch) of least relative
    squared error over the ZeRO-3 rows (see the module docstring); None without such rows."""
    used = [r for r in rows if r.zero3 and r.hook_x > 0 and r.measured_s]
    if not used:
        return None
    num = sum(
        (r.hook_x / (r.measured_s or 1)) * ((r.measured_s or 0) - r.others_s) / (r.measured_s or 1)
        for r in used
    )
    den = sum((r.hook_x / (r.measured_s or 1)) ** 2 for r in used)
    return num / den, used


def table(rows: list[Measured]) -> str:
    """The rows as a fixed-width table, the unpredicted ones under it."""
    lines = [f"{'run':<30}{'measured s':>11}{'predicted s':>12}{'error':>8}  fitted figures  source"]
    for r in rows:
        if r.overrides is None:
            continue
        measured = f"{r.measured_s:11.3f}" if r.measured_s is not None else f"{'-':>11}"
        predicted = f"{r.predicted_s:12.3f}" if r.predicted_s is not None else f"{'-':>12}"
        error = f"{100 * r.error:+7.0f}%" if r.error is not None else f"{'-':>8}"
        fitted = ", ".join(r.fitted) or "-"
        note = f" ({r.note})" if r.note else ""
        lines.append(f"{r.label:<30}{measured}{predicted}{error}  {fitted:<14}  {r.source}{note}")
    for r in rows:
        if r.overrides is None:
            why = r.note or "its overrides are not recorded"
            lines.append(f"not predicted: {r.label} ({r.source}): {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Plan every committed GPU measurement and print the table, the errors and, with --fit, the fit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="print the least-squares ZeRO-3 hook figure")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--runs", default=None, help="a gpu_check folder's run_tm_* runs instead")
    parser.add_argument("--cluster", default=None, help="with --runs: plan them on this cluster's file")
    args = parser.parse_args(argv)
    rows = new_runs(Path(args.runs), args.cluster) if args.runs else measurements()
    for row in rows:
        _plan(row)
    print(table(rows))
    if not args.runs:
        for source, what in NOT_LADDER:
            print(f"not predicted: {what} ({source}): not ladder")
    if args.fit:
        fitted = fit_hooks(rows)
        if fitted is None:
            print("fit: no ZeRO-3 row with a hooks term")
        else:
            figure, used = fitted
            print(
                f"fit: zero3_hook_s={figure:.6g} over {len(used)} ZeRO-3 rows: "
                + ", ".join(r.label for r in used)
            )
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(row) for row in rows], indent=1))
    print(summary(rows))


if __name__ == "__main__":
    main()
