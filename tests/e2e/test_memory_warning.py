"""A run the plan says will not fit starts all the same, with a warning that names the numbers."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import (
    CAPPED_ENV,
    OUT_OF_MEMORY_RUN,
    ROOT,
    address_space_cap_for_out_of_memory,
    clean_env,
)

pytestmark = pytest.mark.unit


def test_a_run_that_will_not_fit_warns_before_launch_and_records_it(train):
    # 0.05 GB of device memory: the tiny model's 0.1 GB plan does not fit.
    result = train(
        "batch.micro_size=8",
        "cluster.device_memory_gb=0.05",
        "train.steps=1",
        "logger=none",
        "data=synthetic",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = result.summary["plan_warnings"]
    assert len(warnings) == 1 and "more than its 0.0 GB usable" in warnings[0], warnings
    assert "plan: the plan puts 0.1 GB on each device" in result.stdout


def test_a_run_that_fits_has_no_warning(train):
    result = train("train.steps=1", "logger=none", "data=synthetic")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["plan_warnings"] == []


def _rank_pids(run_dir: Path) -> list[int]:
    """The rank processes (``python -m launchers.worker RUN_DIR``) of this run, from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or it ended while we read
            continue
        if b"launchers.worker" in words and str(run_dir).encode() in words:
            pids.append(int(entry.name))
    return pids


def test_a_rank_killed_like_the_oom_killer_does_is_named_with_the_plans_warning(tmp_path):
    """A rank that dies of SIGKILL leaves no failure record of its own: the run's error says
    how it ended, what usually sends it, and what the plan had warned before the launch."""
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}"]
    command += ["batch.micro_size=8", "cluster.device_memory_gb=0.05", "train.steps=1000"]
    command += ["logger=none", "data=synthetic"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=clean_env(), stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before a step"
        time.sleep(0.05)
    (rank,) = _rank_pids(run_dir)
    os.kill(rank, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr[-3000:]
    error = json.loads((run_dir / "summary.json").read_text())["error"]
    assert error.startswith("killed by SIGKILL (on Linux most often the out-of-memory killer"), error
    assert "the plan had warned: the plan puts 0.1 GB on each device" in error
    assert f"rank 0 failed: {error}" in stderr


def test_a_rank_out_of_memory_says_where_with_the_plans_terms_and_the_fixes(tmp_path):
    """A real allocator refusal: the rank's address space capped (``ulimit -v``) below what the
    step's activations take (3.1 GB at micro 64 of 512 tokens, planned). The error says so before
    the first step ended, with the plan's terms, the cap, and what shrinks the activations."""
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *OUT_OF_MEMORY_RUN]
    cap = address_space_cap_for_out_of_memory()

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = clean_env(CAPPED_ENV)
    proc = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, preexec_fn=capped
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    error = json.loads((run_dir / "summary.json").read_text())["error"]
    assert "DefaultCPUAllocator: can't allocate memory" in error, error
    assert "out of memory before its first step ended" in error
    assert "the plan puts 3.16 GB on each device" in error and "activations 3.12 GB at micro 64" in error
    assert f"capped at {cap / 1e9:.2f} GB (ulimit -v)" in error
    assert "model.activation_checkpointing=full or a smaller batch.micro_size" in error
    assert f"rank 0 failed: {error}" in proc.stderr
