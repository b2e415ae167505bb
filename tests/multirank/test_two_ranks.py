"""Two ranks on CPU with gloo and real DeepSpeed: the run a user starts with gpus=2."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from train_helpers import ROOT, TrainResult, assert_mfu_within_the_calibrated_peak, clean_env, run_torchrun

from launchers.local import free_port
from runner.metrics.phase_clock import PHASES
from runner.report.rows import fmt_gb

pytestmark = pytest.mark.multirank


METRICS = {
    "loss",
    "lr",
    "grad_norm",
    "throughput/tokens_per_s",
    "throughput/tokens_per_s_per_device",
    "throughput/tflops_per_device",
    "throughput/mfu",
    "throughput/mfu_causal",
    "memory/peak_gb",
    "time/step_s",
}


SECRET = "ladder-test-secret-0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(("parallel", "logger"), [("ddp", "wandb"), ("zero3", "none")])
def test_two_ranks_train_and_leave_their_files(train, tmp_path, parallel, logger):
    extensions = tmp_path / "torch_extensions"
    result = train(
        "gpus=2",
        f"parallel={parallel}",
        f"logger={logger}",
        "batch.global_size=16",
        "batch.micro_size=4",
        "train.steps=5",
        "train.profile_step=3",
        env={"WANDB_API_KEY": SECRET, "TORCH_EXTENSIONS_DIR": str(extensions)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # DeepSpeed's inference-only shared-memory all-reduce is never compiled for training
    # (runner/engine/distributed.py): a first run on a fresh machine starts in seconds, not 45 s.
    assert not (extensions.exists() and any(extensions.rglob("*.so"))), list(extensions.rglob("*"))
    run_dir = result.run_dir
    assert_run_files(run_dir, parallel)
    assert_summary_and_metrics(result)
    if logger == "wandb":
        assert list(run_dir.glob("wandb/offline-run-*")), "wandb offline run missing"
    assert_console_tables(result.stdout, result.summary, run_dir)
    assert_step_profile(result.summary, run_dir)


def assert_run_files(run_dir: Path, parallel: str) -> None:
    """The run's files: no secret from the environment lands in any, none is world-writable; ZeRO-3's
    buckets from the model's width."""
    for path in [run_dir, *run_dir.rglob("*")]:
        assert not path.stat().st_mode & 0o002, path
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    for name in (".hydra/config.yaml", "deepspeed_config.json", "metrics.jsonl", "summary.json"):
        assert (run_dir / name).exists(), name
    if parallel == "zero3":
        # ZeRO-3's prefetch and persistence from the tiny model's width h = 256: 0.9 h^2, 10h.
        zero = json.loads((run_dir / "deepspeed_config.json").read_text())["zero_optimization"]
        assert (zero["stage3_prefetch_bucket_size"], zero["stage3_param_persistence_threshold"]) == (
            58_982,
            2_560,
        )
        assert zero["stage3_max_live_parameters"] == 1_000_000_000


def assert_summary_and_metrics(result: TrainResult) -> None:
    """summary.json's layout, size and measurements, and metrics.jsonl's steps, against each other."""
    summary = result.summary
    assert summary["status"] == "completed"
    assert summary["layout"] == {
        "gpus": 2,
        "dp": 2,
        "tp": 1,
        "pp": 1,
        "micro_size": 4,
        "accum_steps": 2,
        "global_size": 16,
        "sp": 1,
    }
    assert summary["num_params"] == 3_229_952
    metrics = result.metrics
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    assert set(metrics[0]) >= METRICS
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5
    assert_mfu_within_the_calibrated_peak(result)
    # At every ZeRO stage: each micro-batch's gradient, read by hooks during backward,
    # against the step's gives the noise scale; the time blocked in collectives is logged.
    assert math.isfinite(metrics[-1]["batch/noise_scale"])
    assert summary["noise_scale"]["small_batch"] == 4 and summary["noise_scale"]["big_batch"] == 16
    assert summary["noise_scale"]["unmeasured"] is None
    assert all(m["time/comm_exposed_s"] > 0 for m in metrics)
    assert summary["comm_exposed"]["unmeasured"] is None
    # The plan's exposed communication per step is recorded beside the measured (None: this host's
    # collectives not priced, the prediction a lower bound).
    planned = summary["comm_exposed"]["planned_seconds_per_step"]
    assert planned == summary["step_time"]["comm_exposed_s"]
    assert (planned is None) == summary["step_time"]["predicted_is_lower_bound"]
    # Where the time goes: the phases partition each step, and the work is in forward and backward.
    for m in metrics:
        phases = {phase: m[f"time/{phase}_s"] for phase in (*PHASES, "other")}
        assert sum(phases.values()) == pytest.approx(m["time/step_s"], rel=0.02), phases
        assert phases["forward"] > 0 and phases["backward"] > phases["data"], phases


def assert_console_tables(stdout: str, summary: dict[str, Any], run_dir: Path) -> None:
    """The console ends with the run's speed and its ledger, measured beside estimated."""
    tables = stdout[stdout.index("speed, medians over the steps after the first") :]
    assert "completed" in tables and "memory per device" in tables
    assert f"{summary['memory']['measured']['params_gb']:.3f}" in tables
    # ... and the peak its plan put on each device at launch, the plan=true total of its layout.
    planned = summary["device_memory_plan"]["planned_peak_gb"]
    assert summary["device_memory_plan"]["fits"] and 0 < planned < summary["memory"]["measured"]["peak_gb"]
    assert any(line.split()[:2] == ["plan", fmt_gb(planned)] for line in tables.splitlines())
    assert f"ladder report {run_dir}" in tables
    # On a CPU the measured total is the process's RSS, not a peak of tensors: the console says so.
    host_plan = summary["host_memory"]["planned_per_rank_gb"]
    assert "on a CPU the measured total is the process's high-water RSS" in tables
    assert f"plan=true's host memory for a rank: {fmt_gb(host_plan)} GB" in tables


def assert_step_profile(summary: dict[str, Any], run_dir: Path) -> None:
    """train.profile_step: each rank's trace of step 3 and its operator table."""
    assert summary["profile"]["files"] == ["profile/rank0_step3.json", "profile/rank0_step3_ops.txt"]
    for rank in (0, 1):
        events = json.loads((run_dir / "profile" / f"rank{rank}_step3.json").read_text())["traceEvents"]
        names = {event.get("name", "") for event in events}
        assert any(name.startswith("aten::mm") for name in names), rank  # the matmuls
        # The gradients' reduction (DDP's all-reduce, ZeRO-3's reduce-scatter) on the same timeline.
        assert any("reduce_scatter" in name or "allreduce" in name for name in names), rank
        table = (run_dir / "profile" / f"rank{rank}_step3_ops.txt").read_text()
        assert "Self CPU" in table and "aten::" in table


def test_torchrun_starts_the_ranks_into_one_named_directory(tmp_path):
    """``torchrun ... train.py hydra.run.dir=X``: every rank composes; rank 0 alone guards X."""
    run_dir = tmp_path / "run"
    result = run_torchrun(
        "gpus=2", "train.steps=2", "logger=none", "data=synthetic", nproc=2, run_dir=run_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["layout"]["dp"] == 2


def test_a_rank_that_starts_late_is_rank_0s_wait_to_join_the_process_group(tmp_path):
    """Two ranks started by hand, as any launcher would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
    the second 6 s after the first, as on a node slow to start: rank 0's launch holds the wait,
    and its end names it as the time spent joining the process group."""
    run_dir = tmp_path / "run"
    port, late_s = free_port(), 6.0
    ranks = []
    for rank in (0, 1):
        env = clean_env()
        env.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        command = [sys.executable, str(ROOT / "train.py"), "gpus=2", "train.steps=2", "logger=none"]
        command += ["data=synthetic", f"hydra.run.dir={run_dir}"]
        ranks.append(subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True))
        time.sleep(late_s if rank == 0 else 0.0)
    stdout = [rank.communicate(timeout=600)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], stdout
    wall = json.loads((run_dir / "summary.json").read_text())["wall_time"]
    # Rank 1's own start-up before it joins is about rank 0's, so rank 0 waits about the 6 s; on a
    # busy host their start-ups may differ by seconds, hence the margin of half of it.
    assert late_s / 2 < wall["process_group_s"] < wall["launch_s"], wall
    assert f"({wall['process_group_s']:.1f} s of it joining the process group)" in stdout[0]
