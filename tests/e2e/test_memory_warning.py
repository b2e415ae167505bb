"""A run the plan says will not fit starts all the same, with a warning that names the numbers."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest
from train_helpers import (
    CAPPED_ENV,
    OUT_OF_MEMORY_RUN,
    ROOT,
    address_space_cap_for_out_of_memory,
    capped_cgroup,
    clean_env,
    rank_pids,
)

from runner.diagnose.oom_killer import KILLED, kernel_log, read_counts

pytestmark = pytest.mark.e2e


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


def test_a_rank_killed_by_another_process_is_named_first_and_not_blamed_on_memory(tmp_path):
    """Rank 1 of 2 dies of SIGKILL and leaves no failure record; rank 0 then fails at its next
    collective (gloo: "Connection closed by peer") and records that. The run's error names
    rank 1 and how it ended first, then rank 0's error; as the kernel counted no out-of-memory
    kill meanwhile, it says another process sent the signal, and leaves the plan's warning of
    memory out."""
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", "gpus=2"]
    command += ["batch.micro_size=8", "cluster.device_memory_gb=0.05", "train.steps=1000"]
    command += ["logger=none", "data=synthetic"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=clean_env(), stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before a step"
        time.sleep(0.05)
    ranks = rank_pids(run_dir)
    assert sorted(ranks) == [0, 1]
    os.kill(ranks[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    error = summary["error"]
    assert summary["failed_rank"] == 1 and f"rank 1 failed: {error}" in stderr
    assert "; then rank 0 failed: RuntimeError: " in error, error
    rank_0 = json.loads((run_dir / "failure_rank0.json").read_text())["error"]
    assert "; another rank's process ended first and this rank learned of it at its next collective" in rank_0
    if read_counts().host is None:  # a kernel before 4.13 counts no kills: the usual cause, the plan's word
        assert error.startswith("killed by SIGKILL (on Linux most often the out-of-memory killer"), error
        assert "the plan had warned: the plan puts 0.1 GB on each device" in error
        return
    assert error.startswith("killed by SIGKILL (not by the kernel's out-of-memory killer"), error
    assert "another process sent it" in error and "the plan had warned" not in error


def test_a_rank_the_out_of_memory_killer_ends_is_named_so_with_the_kernels_words(tmp_path):
    """A real kill: the run in a memory cgroup capped at 2.5 GB (a SLURM job's --mem, a
    container's limit) that a cluster file's 64 GB of host RAM hides from the host check, and a
    step whose activations the plan puts at 3.12 GB. The device check warns, the run starts,
    and the kernel's out-of-memory killer ends the rank. The error says it was the killer, with
    the kernel's own line where this user may read its log, and the plan's warning."""
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *OUT_OF_MEMORY_RUN]
    command.append("cluster.host_memory_gb=64")
    with capped_cgroup(2_500_000_000) as (_, join):
        proc = subprocess.run(
            command,
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=join,
        )
    assert proc.returncode == 1, proc.stderr[-3000:]
    error = json.loads((run_dir / "summary.json").read_text())["error"]
    assert f"rank 0 failed: {error}" in proc.stderr
    if KILLED.search(kernel_log()):  # the kernel's log is readable here, and names the rank
        assert error.startswith(
            "killed by SIGKILL (the kernel's out-of-memory killer ended it, "
            "its memory cgroup's cap spent, at "
        ), error
        assert "(kernel log: Memory cgroup out of memory: Killed process " in error
    else:
        assert error.startswith(
            "killed by SIGKILL (the kernel's out-of-memory killer was at work while "
            "it ran: 1 in the run's memory cgroup"
        ), error
    assert "the plan had warned: the plan puts 3.2 GB on each device, more than its 2.2 GB usable" in error


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
