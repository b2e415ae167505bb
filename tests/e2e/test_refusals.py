"""Bad input is refused before any rank starts, naming the key, the value and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from train_helpers import ROOT, TrainResult, clean_env, file_digests, run_torchrun, run_train

from runner.hardware.cuda_devices import gpu_driver_present

pytestmark = pytest.mark.e2e


# (overrides, fragments the message must hold): key, value and the fix.
CASES = [
    # impossible layouts
    (
        ["batch.global_size=16", "batch.micro_size=3", "gpus=2"],
        ["batch.micro_size=3", "x dp 2", "{1, 2, 4, 8}"],
    ),
    (["gpus=3"], ["gpus 3", "try gpus in {1, 2, 4, 8, 16}"]),
    (["gpus=2", "batch.global_size=4", "batch.micro_size=4"], ["batch.micro_size=4", "{1, 2}"]),
    (["gpus=0"], ["gpus=0", "at least 1"]),
    (["gpus=64"], ["gpus=64", "hydra/launcher=slurm", "plan=true"]),
    # a SLURM launcher without -m: Hydra would run the job here; the fix is the sweep's command
    (
        ["hydra/launcher=slurm", "gpus=2"],
        ["hydra/launcher=slurm", "only in a sweep", "python train.py -m hydra/launcher=slurm gpus=2"],
    ),
    # a model whose micro 1 fits no device of this cluster: the auto micro-batch says so
    (["model=llama_70b"], ["  - batch.micro_size=auto: not even micro 1 fits", "plan=true"]),
    (["batch.global_size=0"], ["batch.global_size=0", "at least 1"]),
    (["batch.micro_size=four"], ["batch.micro_size", "four", "auto"]),
    # out-of-range values
    (["train.steps=-1"], ["train.steps=-1", "at least 1"]),
    (["train.steps=0"], ["train.steps=0", "at least 1"]),
    (["optimizer.lr=-1"], ["optimizer.lr=-1", "positive"]),
    (["optimizer.warmup_steps=-5"], ["optimizer.warmup_steps=-5", "0 or more"]),
    (["optimizer.min_lr_ratio=2"], ["optimizer.min_lr_ratio=2", "[0, 1]"]),
    (["optimizer.reference_batch=0"], ["optimizer.reference_batch=0", "at least 1"]),
    (
        ["precision.loss_scale_window=0"],
        ["precision.loss_scale_window=0", "e.g. precision.loss_scale_window=1000"],
    ),
    (["parallel.zero_stage=5"], ["parallel.zero_stage=5", "in [0, 3]"]),
    (["data.seq_len=1"], ["data.seq_len=1", "at least 2"]),
    (["data.seq_len=4096"], ["data.seq_len=4096", "model.max_seq_len=1024"]),
    (["planner.headroom=1.5"], ["planner.headroom=1.5", "(0, 1]"]),
    # ranges torch would have refused in rank 0, with a traceback
    (
        ["optimizer.weight_decay=-1"],
        ["optimizer.weight_decay=-1", "0 or more", "e.g. optimizer.weight_decay=0.1"],
    ),
    (["optimizer.beta2=1"], ["optimizer.beta2=1", "in [0, 1)"]),
    # non-finite floats pass a range written as comparisons; torch would refuse them in a rank
    (["optimizer.lr=inf"], ["optimizer.lr=inf", "finite", "e.g. optimizer.lr="]),
    (["optimizer.grad_clip=nan"], ["optimizer.grad_clip=nan", "finite"]),
    # a named GPU cluster on a host without its device would train on the CPU
    (
        ["cluster=h200"],
        ["cluster=h200", "this host, which has", "plan=true", "hydra/launcher=slurm"],
    ),
    # more than all of this host's RAM (the figure given here: a run within the headroom warns)
    (
        ["cluster.host_memory_gb=0.2"],
        ["this host has 0.2 GB of RAM [config: cluster.host_memory_gb]", "planner.recommend=true"],
    ),
    (["logger.log_every=0"], ["logger.log_every=0", "at least 1"]),
    (["train.checkpoint_every=-1"], ["train.checkpoint_every=-1"]),
    (["train.max_skipped_steps=-1"], ["train.max_skipped_steps=-1", "0 or more"]),
    (
        ["train.steps=5", "train.profile_step=5"],
        ["train.profile_step=5", "0 to train.steps - 1 = 4", "train.profile_step=2"],
    ),
    (["model.n_head=5"], ["model.d_model=256", "model.n_head=5", "divisors"]),
    (["model.n_kv_head=3"], ["model.n_kv_head=3", "model.n_head=4"]),
    (["model.vocab_size=100"], ["model.vocab_size=100", "data.path"]),
    (["data.dtype=int8"], ["data.dtype", "int8", "uint16"]),
    # contradictory options
    # (precision=fp16 on a CPU without fp16 kernels: tests/e2e/test_cpu_kernels.py)
    (
        ["parallel=ddp", "parallel.offload_optimizer=cpu"],
        ["parallel.offload_optimizer=cpu", "parallel=zero2"],
    ),
    (["parallel=zero2", "parallel.offload_param=cpu"], ["parallel.offload_param=cpu", "parallel=zero3"]),
    # pipeline parallel: DeepSpeed's pipeline engine takes ZeRO 0-1; each stage needs a block
    (
        ["parallel=zero2", "parallel.pp=2", "gpus=2"],
        ["parallel.pp=2", "parallel.zero_stage=2", "ZeRO-2 and ZeRO-3", "parallel=pp2"],
    ),
    (
        ["parallel=zero3", "parallel.pp=2", "gpus=2"],
        ["parallel.pp=2", "parallel.zero_stage=3", "parallel=zero1"],
    ),
    (["parallel.pp=8", "gpus=8"], ["parallel.pp=8", "model.n_layer=4", "parallel.pp <= 4"]),
    # tensor parallel: heads and MLP width split whole, a group inside one node, dp whole
    (["parallel.tp=3", "gpus=3"], ["parallel.tp=3", "model.n_head=4", "{1, 2, 4}", "model.ffn_hidden=688"]),
    (
        ["parallel.tp=2", "model.n_head=8", "model.n_kv_head=1", "gpus=2"],
        ["parallel.tp=2", "model.n_kv_head=1", "key/value heads"],
    ),
    (
        ["cluster=h100_sxm", "parallel.tp=16", "model.n_head=16", "gpus=16"],
        ["parallel.tp=16", "cluster=h100_sxm (8 gpus per node)", "{1, 2, 4, 8}"],
    ),
    (
        ["parallel.tp=1024", "gpus=1024", "model.d_model=2048", "model.n_head=1024", "model.ffn_hidden=2048"],
        ["parallel.tp=1024", "exceeds this host", "inside one node"],
    ),
    (["parallel.tp=2", "gpus=3"], ["gpus=3", "tp x pp = 2 x 1 = 2", "{2, 4, 6, 8}"]),
    # missing files, and token files that cannot be this run's tokens (TOKEN_FILES)
    (["data.path=/nonexistent/tokens.bin"], ["data.path=/nonexistent/tokens.bin", "no such file"]),
    (["data.path={odd_bytes}"], ["odd_bytes.bin' holds 3 bytes", "multiple of 2", "check data.dtype"]),
    (["data.path={large_ids}"], ["token id 999 >= model.vocab_size=256", "model.vocab_size > 999"]),
    (["data.path={short}"], ["holds 10 tokens", "data.seq_len + 1 = 129", "lower data.seq_len"]),
    # Evaluation reads held-out tokens: never a silent slice of the user's own.
    (
        ["train.eval_every=5", "data.path={good}"],
        ["train.eval_every=5", "data.val_path", "none of your tokens"],
    ),
    (["train.eval_every=5", "data.val_path=/nonexistent/val.bin"], ["data.val_path=/nonexistent/val.bin"]),
    (
        ["train.eval_every=5", "data.val_path={large_ids}"],
        ["data.val_path=", "token id 999 >= model.vocab_size"],
    ),
    (["train.eval_every=-1"], ["train.eval_every=-1", "0 or more"]),
    (["train.eval_batches=0"], ["train.eval_batches=0", "at least 1"]),
    (["data=synthetic", "data.val_path=/x.bin"], ["data.val_path=/x.bin", "for data=text"]),
    # wrong types, unknown keys and options (refused by the schemas during composition)
    (["gpus=two"], ["gpus", "two"]),
    (["optimizer.lr=fast"], ["optimizer.lr", "fast"]),
    (["model.n_layr=2"], ["n_layr"]),
    (["foo=1"], ["foo"]),
    (["parallel=zero9"], ["parallel", "zero9"]),
    (["precision=fp8"], ["precision", "fp8"]),
    (["optimizer.name=lamb"], ["lamb"]),
    (["logger.mode=sometimes"], ["sometimes"]),
    (["train.resume=sometimes"], ["sometimes"]),
    (["train.on_nonfinite=ignore"], ["train.on_nonfinite", "ignore", "stop", "skip"]),
    # a misspelt key or option: the closest valid one, not Hydra's advice to add the key with +
    (["train.step=10"], ["no key train.step; did you mean train.steps?"]),
    (["+train.step=10"], ["no key train.step", "did you mean train.steps?"]),
    (["parallel=zero4"], ["no option parallel=zero4; did you mean zero3, zero2 or zero1?"]),
]


# Token files the cases above name by {key}: written into the fixture's folder.
TOKEN_FILES = {
    "odd_bytes": b"abc",
    "large_ids": np.array([1, 2, 999, 3] * 64, dtype=np.uint16).tobytes(),
    "short": np.arange(10, dtype=np.uint16).tobytes(),
    "good": (np.arange(1000) % 256).astype(np.uint16).tobytes(),
}


@dataclass
class Refusal:
    """One case's run, and the neighbouring directory it must leave as it was."""

    result: TrainResult
    neighbour: Path
    neighbour_before: dict[str, str]


def _case_id(overrides: list[str]) -> str:
    return " ".join(overrides)


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, Refusal]:
    """Every case's ``python train.py``, as many at once as this host has cores: each is one process."""
    root = tmp_path_factory.mktemp("refusals")
    files = {}
    for name, content in TOKEN_FILES.items():
        files[name] = root / f"{name}.bin"
        files[name].write_bytes(content)

    def refuse(number: int, overrides: list[str]) -> Refusal:
        case_dir = root / f"case{number}"
        neighbour = case_dir / "earlier"
        neighbour.mkdir(parents=True)
        (neighbour / "summary.json").write_text('{"status": "completed"}')
        before = file_digests(neighbour)
        named = [override.format(**files) for override in overrides]
        result = run_train(*named, "logger=none", run_dir=case_dir / "run", timeout=120)
        return Refusal(result, neighbour, before)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = {
            _case_id(overrides): pool.submit(refuse, number, overrides)
            for number, (overrides, _) in enumerate(CASES)
        }
    return {case: run.result() for case, run in runs.items()}


@pytest.mark.parametrize(("overrides", "fragments"), CASES, ids=[_case_id(c[0]) for c in CASES])
def test_refused_before_launch(refusals, overrides, fragments):
    refusal = refusals[_case_id(overrides)]
    result = refusal.result
    assert result.returncode == 2, result.stderr[-2000:]
    text = result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text[-2000:]}"
    assert "Traceback" not in result.stderr
    said = [line.split(":", 1)[0] for line in result.stderr.splitlines() if line.startswith("  - ")]
    if "refused before launch:" in result.stderr:  # a list of problems, each on its own line
        assert said, result.stderr[-2000:]
    assert len(said) == len(set(said)), f"a problem said twice:\n{result.stderr[-2000:]}"
    assert not result.run_dir.exists(), "a refused run leaves no directory behind"
    assert file_digests(refusal.neighbour) == refusal.neighbour_before


def test_a_bad_value_is_refused_alone_not_with_the_defaults_it_unsettles(refusals):
    """train.steps=-1 is one mistake: train.profile_step's default (-1, none) is not a second."""
    text = refusals[_case_id(["train.steps=-1"])].result.stderr
    assert "train.steps=-1" in text and "profile_step" not in text, text[-2000:]


def test_a_refused_command_leaves_no_run_directory(tmp_path):
    """gpus=3 on this host, as a newcomer types it (no hydra.run.dir): no outputs/<date>/<time>/."""
    command = [sys.executable, str(ROOT / "train.py"), "gpus=3", "logger=none"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "try gpus in {1, 2, 4, 8, 16}" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_existing_run_directory_is_never_reused(train, tmp_path):
    held = tmp_path / "run0"
    held.mkdir()
    (held / "summary.json").write_text('{"status": "completed"}')
    before = file_digests(held)
    result = train("train.steps=1", timeout=120)
    assert result.returncode == 2
    assert "already holds a run" in result.stderr
    assert file_digests(held) == before


def test_a_refusal_answers_before_torch_is_imported(tmp_path):
    """Every check runs before the launching process needs torch: a refusal takes about a second."""
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",  # each module the process imports, one line each on stderr
            str(ROOT / "train.py"),
            "train.steps=5",
            "train.profile_step=9",
            "gpus=3",
            "logger=none",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "train.profile_step=9" in proc.stderr and "gpus 3" in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines}
    assert "runner.preflight.validate" in imported
    assert "deepspeed" not in imported
    if not gpu_driver_present():  # with a GPU driver, torch is asked how many devices there are
        assert "torch" not in imported


def test_a_resume_with_nothing_to_continue_keeps_the_earlier_attempt(train, tmp_path):
    """train.resume=auto where a run finished without checkpoints starts over, and the run it
    would have replaced (metrics, summary, the config it ran with) moves to earlier_attempts/1/."""
    finished = train("train.steps=1", "logger=none", "data=synthetic", timeout=120)
    assert finished.returncode == 0, finished.stderr[-3000:]
    run_dir = finished.run_dir
    metrics = (run_dir / "metrics.jsonl").read_text()
    again = run_train(
        "train.steps=2", "train.resume=auto", "logger=none", "data=synthetic", run_dir=run_dir, timeout=120
    )
    assert again.returncode == 0, again.stderr[-3000:]
    earlier = run_dir / "earlier_attempts" / "1"
    assert (earlier / "metrics.jsonl").read_text() == metrics
    assert '"status": "completed"' in (earlier / "summary.json").read_text()
    assert "train.steps=1" in (earlier / ".hydra" / "overrides.yaml").read_text()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert "train.steps=2" in (run_dir / ".hydra" / "overrides.yaml").read_text()


def test_ranks_started_by_torchrun_refuse_once_not_once_a_rank(tmp_path):
    """Every rank refuses alike; rank 0 says why, once, and nothing is written."""
    run_dir = tmp_path / "run"
    result = run_torchrun("logger=none", nproc=2, run_dir=run_dir, timeout=300)
    assert result.returncode != 0
    said = result.stdout + result.stderr
    assert said.count("ladder: refused before launch:") == 1, said[-3000:]
    assert "gpus=1 but the torchrun launcher started 2 ranks; set gpus=2" in said
    assert not (run_dir / "summary.json").exists()
