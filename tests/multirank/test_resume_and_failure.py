"""Runs survive SIGKILL and layout changes with nothing lost; failures end the job, loudly."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkpoint_states import checkpoint_tensors, max_abs_diff
from train_helpers import (
    FP32_TOLERANCE,
    ROOT,
    SMALL_EXPERIMENT,
    TrainResult,
    clean_env,
    file_digests,
    free_port,
    injecting,
    rank_pids,
    run_torchrun,
    run_train,
    start_train,
    wait_for_ranks_to_end,
)

from runner.checkpoint import resume_rules as checkpoint
from runner.diagnose.oom_killer import read_counts
from runner.layout import resolve_layout
from runner.metrics import goodput

pytestmark = pytest.mark.multirank

COMMON = ["batch.global_size=16", "logger=none", "data.seq_len=64"]


def _losses(run_dir: Path) -> dict[int, float]:
    return {
        m["step"]: m["loss"] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    }


def _metrics(run_dir: Path) -> dict[int, dict]:
    return {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    """An uninterrupted 8-step run on 2 ranks at ZeRO-2."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = run_train(
        "gpus=2", "parallel=zero2", "batch.micro_size=4", "train.steps=8", *COMMON, run_dir=run_dir
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return _losses(run_dir)


def _wait_for_steps(run_dir: Path, proc: subprocess.Popen[bytes], steps: int) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            return
        assert proc.poll() is None, "the run ended before it could be stopped"
        time.sleep(0.05)
    raise AssertionError(f"no {steps} steps logged in 300 s")


def test_sigkill_mid_run_then_resume_reproduces_the_uninterrupted_losses(tmp_path, reference):
    """Killed mid-run, a save cut short beside its checkpoints, resumed; then a resume that would
    change the experiment is refused and the finished run is left as it was."""
    run_dir = tmp_path / "run"
    args = [
        "gpus=2",
        "parallel=zero2",
        "batch.micro_size=4",
        "train.steps=8",
        "train.checkpoint_every=2",
        *COMMON,
    ]
    proc = start_train(run_dir, *args)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    logged_when_killed = len(metrics.read_text().splitlines())
    # What SIGKILL left is valid: JSON lines only, and a complete checkpoint named in latest.json.
    for line in metrics.read_text().splitlines():
        json.loads(line)
    latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert latest["completed_steps"] in (4, 6)
    assert (run_dir / "checkpoints" / latest["tag"]).is_dir()
    # A save cut short after it: its directory exists, but latest.json does not name it.
    partial = run_dir / "checkpoints" / f".partial-step_{latest['completed_steps'] + 2:08d}"
    partial.mkdir(exist_ok=True)
    (partial / "mp_rank_00_model_states.pt").write_bytes(b"truncated")

    resumed = run_train(*args, "train.resume=auto", run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.summary["status"] == "completed"
    assert resumed.summary["resumed_from_step"] == latest["completed_steps"]
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(8))
    assert losses == pytest.approx(reference, abs=0.0)  # fp32 on CPU: bit-identical
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert kept == ["step_00000006", "step_00000008"]  # train.keep_checkpoints=2
    # Where the resumed attempt's wall time went: its parts add up, the load and each save counted.
    wall = resumed.summary["wall_time"]
    parts = ("prelaunch", "calibration", "launch", "build", "engine", "resume", "setup")
    parts += ("steps", "checkpoint", "other")
    assert sum(wall[f"{part}_s"] for part in parts) == pytest.approx(wall["total_s"], rel=1e-6)
    assert wall["steps"] == 8 - latest["completed_steps"] and wall["resume_s"] > 0
    assert wall["checkpoints"] == (8 - latest["completed_steps"]) // 2
    one = sum(f.stat().st_size for f in (run_dir / "checkpoints" / "step_00000008").rglob("*") if f.is_file())
    assert wall["checkpoint_gb"] * 1e9 == pytest.approx(one * wall["checkpoints"], rel=0.01)
    # Across both attempts: the killed one's steps after its last checkpoint were trained again.
    across = resumed.summary["goodput"]
    killed, finished = across["attempts"]
    assert killed["status"] == goodput.NO_END and finished["status"] == "completed"
    assert latest["completed_steps"] <= killed["to_step"] <= logged_when_killed
    assert killed["steps_kept"] == latest["completed_steps"] == finished["from_step"]
    assert across["steps_lost"] == killed["steps_lost"] == killed["to_step"] - latest["completed_steps"]
    assert finished["steps_kept"] == 8 - latest["completed_steps"] and finished["steps_s"] == wall["steps_s"]
    assert across["kept_s"] + across["lost_s"] == pytest.approx(killed["steps_s"] + finished["steps_s"])
    assert 0 < across["goodput_elapsed"] < across["goodput"] < 1

    # Another global batch is another experiment: refused before launch, nothing touched.
    before = file_digests(run_dir)
    refused = run_train(*args, "train.steps=10", "train.resume=auto", "batch.global_size=32", run_dir=run_dir)
    assert refused.returncode == 2
    assert "batch.global_size=16" in refused.stderr and "different experiment" in refused.stderr
    assert file_digests(run_dir) == before


def test_ctrl_c_saves_a_checkpoint_and_the_printed_command_continues_to_the_same_losses(tmp_path, reference):
    """Ctrl-C (SIGINT to the terminal's whole process group, ranks included): the ranks finish
    their step, save together and stop; the run says how to continue, and that command ends
    with the uninterrupted run's losses."""
    run_dir = tmp_path / "run"
    args = ["gpus=2", "parallel=zero2", "batch.micro_size=4", "train.steps=8", *COMMON]
    stderr = tmp_path / "stderr.txt"
    proc = start_train(run_dir, *args, stderr=stderr)
    _wait_for_steps(run_dir, proc, 3)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 75  # EX_TEMPFAIL: stopped, to be continued
    said = stderr.read_text()
    assert "Traceback" not in said, said[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    stopped_at = summary["steps_completed"]
    assert 3 <= stopped_at < 8
    assert summary["error"].startswith(f"stopped by SIGINT after {stopped_at} steps with checkpoint")
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["completed_steps"] == stopped_at
    assert not list(run_dir.glob("failure_rank*.json"))
    (line,) = [line for line in said.splitlines() if "continue with:" in line]
    command = shlex.split(line.split("continue with:", 1)[1])
    assert command[-2:] == ["train.resume=required", f"hydra.run.dir={run_dir}"]

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    resumed = subprocess.run(
        [sys.executable, *command[1:]], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == stopped_at
    assert [stop["signal"] for stop in summary["interruptions"]] == ["SIGINT"]
    assert len(summary["layout_history"]) == 1  # resumed in the layout it stopped in
    stopped, finished = summary["goodput"]["attempts"]  # nothing trained twice
    assert (stopped["status"], stopped["to_step"], stopped["steps_lost"]) == ("interrupted", stopped_at, 0)
    assert (finished["from_step"], finished["to_step"], summary["goodput"]["steps_lost"]) == (
        stopped_at,
        8,
        0,
    )
    assert _losses(run_dir) == pytest.approx(reference, abs=0.0)


def test_ranks_under_torchrun_save_a_checkpoint_when_torchrun_is_stopped(tmp_path, reference):
    """SIGTERM to torchrun alone: torchrun passes it to its ranks and waits 30 s before SIGKILL;
    the ranks save after the step and stop, rank 0 says how to continue, and the same torchrun
    command with train.resume=auto ends with the uninterrupted run's losses."""
    run_dir = tmp_path / "run"
    args = ["gpus=2", "parallel=zero2", "batch.micro_size=4", "train.steps=8", *COMMON]
    stderr = tmp_path / "stderr.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    proc = subprocess.Popen(
        [
            *torchrun,
            f"--master_port={free_port()}",
            str(ROOT / "train.py"),
            *args,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=stderr.open("w"),
        env=env,
        start_new_session=True,
    )
    _wait_for_steps(run_dir, proc, 3)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary.get("error")
    stopped_at = summary["steps_completed"]
    assert 3 <= stopped_at < 8
    assert summary["error"].startswith(f"stopped by SIGTERM after {stopped_at} steps with checkpoint")
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["completed_steps"] == stopped_at
    said = stderr.read_text()
    assert f"train.resume=required hydra.run.dir={run_dir}" in said, said[-3000:]

    resumed = run_torchrun(*args, "train.resume=auto", nproc=2, run_dir=run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == stopped_at
    assert _losses(run_dir) == pytest.approx(reference, abs=0.0)


def test_the_deepspeed_launcher_starts_stops_and_resumes_a_run(tmp_path, reference):
    """``deepspeed train.py``: the launcher's ``--local_rank=N`` argument does not reach Hydra;
    at Ctrl-C it ends each rank's process tree, wandb's service first, and the ranks still save
    and stop (wandb's loss is said once); the same command with train.resume=auto ends with the
    uninterrupted run's losses."""
    run_dir = tmp_path / "run"
    args = ["gpus=2", "parallel=zero2", "batch.micro_size=4", "train.steps=8", "batch.global_size=16"]
    args += ["data.seq_len=64", "logger=wandb", "logger.mode=offline"]  # COMMON, with wandb
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    deepspeed = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus=2"]
    stderr = tmp_path / "stderr.txt"
    proc = subprocess.Popen(
        [
            *deepspeed,
            f"--master_port={free_port()}",
            str(ROOT / "train.py"),
            *args,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        stdout=stderr.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    _wait_for_steps(run_dir, proc, 3)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    # deepspeed's outer runner ends at the KeyboardInterrupt; the ranks save after it
    wait_for_ranks_to_end(run_dir)
    said = stderr.read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted", said[-3000:]
    assert summary["launcher"] == "torchrun"  # the same variables: RANK, WORLD_SIZE, LOCAL_RANK
    stopped_at = summary["steps_completed"]
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["completed_steps"] == stopped_at
    assert not list(run_dir.glob("failure_rank*.json")), said[-3000:]
    assert said.count("wandb stopped taking metrics") <= 1

    resume = ["train.resume=auto", f"hydra.run.dir={run_dir}"]
    resumed = subprocess.run(
        [*deepspeed, f"--master_port={free_port()}", str(ROOT / "train.py"), *args, *resume],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == stopped_at
    assert _losses(run_dir) == pytest.approx(reference, abs=0.0)


def test_ranks_whose_launcher_is_killed_save_and_stop_instead_of_training_on(tmp_path):
    """SIGKILL to the launching process alone (an out-of-memory kill, a lost terminal): the kernel
    sends each rank SIGTERM, and the ranks checkpoint and stop rather than train on unwatched."""
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, "gpus=2", "parallel=zero1", "batch.micro_size=4", "train.steps=500", *COMMON)
    _wait_for_steps(run_dir, proc, 2)
    assert len(rank_pids(run_dir)) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for_ranks_to_end(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary["error"]
    assert summary["error"].startswith("stopped by SIGTERM after")
    latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert latest["completed_steps"] == summary["steps_completed"] < 500


def test_resume_from_zero3_on_2_ranks_onto_zero2_on_1_gives_the_uninterrupted_losses(
    tmp_path, one_rank_reference: TrainResult
):
    """Weights, Adam moments and step, LR schedule and data position cross from ZeRO-3 at dp 2
    to ZeRO-2 at dp 1, and the global batch stays. Into ZeRO-3, and across tp and pp: the
    tensor-parallel and pipeline modules' resume chains.

    Against the session's one-rank run of the same experiment, uninterrupted (fp32 layouts
    agree within FP32_TOLERANCE: test_layout_invariance.py).
    """
    run_dir = tmp_path / "run"
    saved = ["gpus=2", "parallel=zero3", "train.steps=4", "train.checkpoint_every=4"]
    first = run_train(*saved, *SMALL_EXPERIMENT, run_dir=run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = ["gpus=1", "parallel=zero2", "train.steps=8", "train.resume=auto"]
    second = run_train(*resumed, *SMALL_EXPERIMENT, run_dir=run_dir)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.summary["resumed_from_step"] == 4
    layout = second.summary["layout"]
    assert (layout["gpus"], layout["global_size"], layout["accum_steps"]) == (1, 16, 4)
    assert (run_dir / "checkpoints" / "step_00000004_universal").is_dir()
    # DeepSpeed's pointers each name a folder that is there.
    for pointer in ("latest", "latest_universal"):
        named = run_dir / "checkpoints" / pointer
        assert not named.exists() or (named.parent / named.read_text().strip()).is_dir(), pointer
    expected, losses = _losses(one_rank_reference.run_dir), _losses(run_dir)
    assert sorted(losses) == list(range(8))
    for step in range(4, 8):  # without the Adam moments or step the gap is 1e-2 and more
        assert losses[step] == pytest.approx(expected[step], abs=FP32_TOLERANCE), step


def test_a_ddp_checkpoint_resumes_as_ddp_at_any_gpus(tmp_path, one_rank_reference: TrainResult):
    """Stage 0 saves the whole model and optimizer state once: DeepSpeed loads it at any dp."""
    two = resolve_layout(gpus=2, tp=1, pp=1, global_size=16, micro_size=4)
    one = resolve_layout(gpus=1, tp=1, pp=1, global_size=16, micro_size=4)
    record = {"tag": "step_00000004", "layout": two.to_json(), "zero_stage": 0}
    assert not checkpoint.needs_universal(record, layout=one, zero_stage=0)
    experiment = ["parallel=ddp", *SMALL_EXPERIMENT]
    run_dir = tmp_path / "run"
    first = run_train("gpus=2", "train.steps=4", "train.checkpoint_every=4", *experiment, run_dir=run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_train("gpus=1", "train.steps=6", "train.resume=auto", *experiment, run_dir=run_dir)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.summary["resumed_from_step"] == 4
    losses, expected = _losses(run_dir), _losses(one_rank_reference.run_dir)
    for step in (4, 5):
        assert losses[step] == pytest.approx(expected[step], abs=FP32_TOLERANCE), step


def test_a_rank_that_raises_brings_the_job_down(tmp_path):
    started = time.monotonic()
    result = run_train(
        "gpus=2",
        "train.steps=20",
        "batch.micro_size=4",
        *COMMON,
        run_dir=tmp_path / "run",
        env=injecting(LADDER_INJECT_FAULT="1:2"),
        timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert elapsed < 120, f"the job took {elapsed:.0f} s to fail"
    summary = result.summary
    assert summary["status"] == "failed"
    assert summary["failed_rank"] == 1
    assert "fault injected" in summary["error"]
    assert "rank 1 failed" in result.stderr


def test_under_torchrun_a_rank_whose_peer_is_killed_says_another_rank_ended_first(tmp_path):
    """Rank 1 of torchrun's 2 dies of SIGKILL; rank 0 fails at its next collective, and its
    error (summary.json's, and its failure record's) says another rank's process ended first,
    where the launcher names it, and that the kernel's out-of-memory killer was not at work."""
    run_dir = tmp_path / "run"
    stderr = tmp_path / "stderr.txt"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
    ]
    command += [str(ROOT / "train.py"), "gpus=2", "train.steps=1000", *COMMON, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr.open("w"), env=clean_env()
    )
    _wait_for_steps(run_dir, proc, 1)
    ranks = rank_pids(run_dir)
    assert sorted(ranks) == [0, 1]
    os.kill(ranks[1], signal.SIGKILL)
    assert proc.wait(timeout=120) != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_rank"] == 0
    error = summary["error"]
    assert error.startswith("RuntimeError: ") and "Connection closed by peer" in error, error
    assert (
        "; another rank's process ended first and this rank learned of it at its next collective: " in error
    )
    assert "the launcher's report names that rank and how it ended (torchrun: its Root Cause" in error
    if read_counts().host is not None:
        assert error.endswith(
            "the kernel's out-of-memory killer ended nothing on this host while this rank ran"
        )
    assert json.loads((run_dir / "failure_rank0.json").read_text())["error"] == error
    assert "Signal 9 (SIGKILL) received by PID" in stderr.read_text()  # torchrun's Root Cause


def test_a_diverging_run_stops_and_keeps_its_last_good_checkpoint(tmp_path):
    result = run_train(
        "train.steps=20",
        "train.checkpoint_every=2",
        "batch.micro_size=8",
        "optimizer.lr=1e30",
        "optimizer.warmup_steps=0",
        "optimizer.grad_clip=0",
        *COMMON,
        run_dir=tmp_path / "run",
    )
    assert result.returncode == 1
    summary = result.summary
    assert summary["status"] == "failed"
    assert "FloatingPointError" in summary["error"] and "optimizer.lr" in summary["error"]
    latest = json.loads((result.run_dir / "checkpoints" / "latest.json").read_text())
    assert latest["completed_steps"] <= summary["steps_completed"]
    for line in (result.run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["step"] < latest["completed_steps"] + 2


def test_a_skipped_nonfinite_step_leaves_weights_and_optimizer_unchanged(tmp_path, reference):
    """ZeRO-2, 2 ranks, accumulation 2: rank 1's loss is NaN at step 2; every rank skips that update."""
    run_dir = tmp_path / "run"
    result = run_train(
        "gpus=2",
        "parallel=zero2",
        "batch.micro_size=4",
        "train.steps=5",
        "train.checkpoint_every=1",
        "train.keep_checkpoints=10",
        "train.on_nonfinite=skip",
        *COMMON,
        run_dir=run_dir,
        env=injecting(LADDER_INJECT_NAN="1:2"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["status"] == "completed"
    assert summary["skipped_steps"] == {"policy": "skip", "count": 1, "steps": [2]}
    metrics = _metrics(run_dir)
    assert [metrics[s]["train/skipped_steps"] for s in range(5)] == [0, 0, 1, 1, 1]
    # Before the skip: the uninterrupted run's losses, bit for bit; after it: finite losses.
    assert [metrics[s]["loss"] for s in (0, 1)] == [reference[0], reference[1]]
    assert all(isinstance(metrics[s]["loss"], float) for s in (3, 4))
    # The schedule advances over a skipped step: lr is the step's (warmup 10: 3e-3 * (s + 1) / 10).
    assert [metrics[s]["lr"] for s in range(5)] == pytest.approx([3e-4 * (s + 1) for s in range(5)])
    # The checkpoint after the skipped step holds exactly what the one before it held:
    # weights, fp32 partitions, Adam's moments and step count (the schedule moved on).
    before, after = checkpoint_tensors(run_dir, "step_00000002"), checkpoint_tensors(run_dir, "step_00000003")
    assert max_abs_diff(before, after) == 0.0
    assert max_abs_diff(checkpoint_tensors(run_dir, "step_00000001"), before) > 0.0  # a step that applied
