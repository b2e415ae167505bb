"""Run ``python train.py`` the way a user does, in a temporary directory; compose conf/ as train.py does.

A plain module on pytest's ``pythonpath`` (pyproject.toml), so every tier imports it by one name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launchers.local import free_port
from runner.hardware.cgroup_memory import memory_cgroup_dirs

ROOT = Path(__file__).resolve().parents[1]

# The experiment the layout tests train on every layout: tiny, fp32, global batch 16 as
# micro 4, sequences of 64 tokens, lr 1e-3. Its fp32 layouts differ only in summation
# order: losses within 1e-5.
SMALL_EXPERIMENT = [
    "batch.global_size=16",
    "batch.micro_size=4",
    "data.seq_len=64",
    "logger=none",
    "optimizer.lr=1e-3",
]
FP32_TOLERANCE = 1e-5
# Steps of the session's one-rank reference run (tests/conftest.py one_rank_reference).
REFERENCE_STEPS = 10

# The memory ledger's runs: two steps (the ledger measures the second) of 16 sequences of 32
# tokens, micro 4. The estimate is exact at any length and batch, and a bf16 step on a CPU
# without native bf16 takes about 10x an fp32 one. Every case accumulates (ZeRO-2 offload
# keeps its host accumulation buffer only then).
SHORT_RUN = ["batch.global_size=16", "batch.micro_size=4", "train.steps=2", "logger=none", "data.seq_len=32"]


def short_run(parallel: str, gpus: int, precision: str = "fp32", optimizer: str = "adamw") -> tuple[str, ...]:
    """SHORT_RUN's overrides on this layout, precision and optimizer."""
    layout = (f"parallel={parallel}", f"gpus={gpus}", f"precision={precision}", f"optimizer={optimizer}")
    return (*layout, *SHORT_RUN)


def without(overrides: list[str], *keys: str) -> list[str]:
    """``overrides`` less those that set any of ``keys``: the caller sets them its own way."""
    return [o for o in overrides if o.split("=", 1)[0] not in keys]


@dataclass
class TrainResult:
    """What a ``python train.py`` run left: its exit code, output and run directory."""

    returncode: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary.json."""
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The run's metrics.jsonl, one dict per logged step."""
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def assert_mfu_within_the_calibrated_peak(result: TrainResult) -> None:
    """The run's last MFU is above 0 and, over a calibration made on quiet cores, below 1.

    The CPU's peak is the best of the two matmul layouts training runs
    (runner.hardware.peak_flops.calibrate_cpu_peak): no run is above one measured on quiet cores,
    bf16 on a CPU without native bf16 included (torch.mm alone read 1.5 GFLOP/s there, and such a
    run 107% MFU). A calibration made while other processes held the cores is provisional
    (runner/hardware/mfu_peak.py) and may read far low (seen: MFU 5.9 over one): a run over it
    says so and leaves the key to be measured again, and that is what is asserted then.
    ``make test`` calibrates before its tiers start (tests/calibrate_cpu_peaks.py).
    """
    mfu = result.metrics[-1]["throughput/mfu"]
    assert mfu > 0, mfu
    calibration = result.summary["peak_flops_calibration"]
    if calibration is None or not calibration.get("busy"):
        assert mfu < 1, (mfu, calibration)
    elif mfu >= 1:
        said = (result.run_dir / "train.log").read_text() + result.stdout + result.stderr
        assert "is above 1: this CPU did more than the peak calibrated earlier" in said


# MemoryCase's fields that its ParallelSpec holds (runner.config.ParallelSpec); its gradient
# bucket and persistence threshold are its own, resolved as DeepSpeed is given them.
CASE_SPEC_FIELDS = (
    "zero_stage",
    "tp",
    "pp",
    "sp",
    "recompute",
    "offload",
    "overlap_comm",
    "contiguous_gradients",
)


def memory_case(**fields: Any) -> Any:
    """A runner.memory_model.case.MemoryCase from flat keywords: the layout's choices among them
    (:data:`CASE_SPEC_FIELDS`) go into its ParallelSpec."""
    from runner.config import ParallelSpec
    from runner.memory_model.case import MemoryCase

    spec = ParallelSpec(**{name: fields.pop(name) for name in CASE_SPEC_FIELDS if name in fields})
    return MemoryCase(spec=spec, **fields)


def plan_json(run_dir: Path) -> dict[str, Any]:
    """A run directory's plan.json, as a user's script reads it."""
    data: dict[str, Any] = json.loads((run_dir / "plan.json").read_text())
    return data


def file_digests(root: Path) -> dict[str, str]:
    """Every file under ``root`` by its relative path, with a digest of its bytes."""
    return {
        str(path.relative_to(root)): hashlib.sha1(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


EARLIER_CONFIG = "train:\n  steps: 8\n"


def earlier_sweep(sweep_dir: Path, cells: list[str]) -> None:
    """A sweep directory as an earlier attempt left it: multirun.yaml and cells that ran."""
    sweep_dir.mkdir()
    (sweep_dir / "multirun.yaml").write_text("hydra: {}\n")
    for cell in cells:
        hydra = sweep_dir / cell / ".hydra"
        hydra.mkdir(parents=True)
        for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
            (hydra / name).write_text(EARLIER_CONFIG if name == "config.yaml" else f"{name}: {cell}\n")
        (sweep_dir / cell / "summary.json").write_text('{"status": "completed"}')
        (sweep_dir / cell / "train.log").write_text("the earlier attempt's log\n")  # Hydra appends


def clean_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """This environment without a launcher's rank variables: the child starts as a user's command
    (piped: without a terminal size the calling shell may export). ``extra``: variables to set, or
    with None to leave out (``{"LADDER_SAVE_FINAL": None}``: a user's default, not the suite's)."""
    env = {**os.environ, "WANDB_SILENT": "true"}
    env.update({key: value for key, value in (extra or {}).items() if value is not None})
    ranks = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID")
    left_out = [key for key, value in (extra or {}).items() if value is None]
    for key in (*ranks, "COLUMNS", "LINES", *left_out):
        env.pop(key, None)
    return env


# A run with the user's default train.save_final=true, which the suite turns off (tests/conftest.py).
USERS_SAVE_FINAL: dict[str, str | None] = {"LADDER_SAVE_FINAL": None}


def injecting(**faults: str) -> dict[str, str]:
    """The environment that installs tests/step_faults.py's hook in a run's ranks, with the faults
    it injects: ``injecting(LADDER_INJECT_NAN="1:2")``."""
    return {"LADDER_STEP_HOOKS": f"{ROOT / 'tests' / 'step_faults.py'}:hooks", **faults}


# A step past a rank's memory cap: tiny at micro 64 of 512 tokens plans 3.12 GB of activations.
OUT_OF_MEMORY_RUN = [
    "batch.global_size=64",
    "batch.micro_size=64",
    "data.seq_len=512",
    "train.steps=2",
    "logger=none",
    "data=synthetic",
]
# Two malloc arenas: a host with many cores would otherwise reserve 64 MB of address space for
# each thread's own arena, which is no memory at all.
CAPPED_ENV = {"MALLOC_ARENA_MAX": "2"}


def address_space_cap_for_out_of_memory() -> int:
    """An address-space cap (``ulimit -v``) a rank starts, builds and sets up under, but that its
    first step of OUT_OF_MEMORY_RUN exceeds: what torch and DeepSpeed map once imported (0.74 GB
    with CPU torch; more with a CUDA build's libraries), plus 1.6 GB, half the step's need."""
    code = "import torch, deepspeed, torch._dynamo; print(open('/proc/self/status').read())"
    status = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=clean_env(CAPPED_ENV)
    ).stdout
    (peak_kb,) = (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmPeak:"))
    return peak_kb * 1024 + 1_600_000_000


def rank_pids(run_dir: Path) -> dict[int, int]:
    """The running rank processes of ``run_dir`` by rank, from /proc: those that name the
    directory on their command line (``launchers.worker RUN_DIR``, or torchrun's
    ``train.py ... hydra.run.dir=RUN_DIR``) with RANK in their environment."""
    pids = {}
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # not a process, or it ended while we read
            continue
        named = str(run_dir).encode() in words or f"hydra.run.dir={run_dir}".encode() in words
        ranks = [int(item[5:]) for item in environ if item.startswith(b"RANK=")]
        if named and ranks:
            pids[ranks[0]] = int(entry.name)
    return pids


def wait_for_ranks_to_end(run_dir: Path, within_s: float = 300) -> None:
    """Wait until no rank of ``run_dir`` runs: a launcher may end before its ranks have saved."""
    deadline = time.monotonic() + within_s
    while rank_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rank_pids(run_dir) == {}, f"ranks of {run_dir} still running after {within_s:.0f} s"


@contextlib.contextmanager
def capped_cgroup(cap_bytes: int) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A new memory cgroup under this process's own, capped at ``cap_bytes`` with no swap: its folder, and a
    ``preexec_fn`` that moves a child process into it. Skips where none can be made (not root,
    no memory hierarchy, the controller not enabled for children); removed afterwards."""
    dirs = memory_cgroup_dirs()
    if not dirs:
        pytest.skip("no memory cgroup hierarchy is mounted")
    parent, limit_file = dirs[0]
    child = parent / f"ladder-test-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError as error:
        pytest.skip(f"this user may not make a cgroup under {parent}: {error}")
    try:
        if not (child / limit_file).exists():
            pytest.skip(f"the memory controller is not enabled for {parent}'s children")
        (child / limit_file).write_text(str(cap_bytes))
        # No swap beyond the cap either, where the host has swap: v2 counts it apart, v1 with it.
        for swap_file, value in (("memory.swap.max", "0"), ("memory.memsw.limit_in_bytes", str(cap_bytes))):
            if (child / swap_file).exists():
                (child / swap_file).write_text(value)

        def join() -> None:
            (child / "cgroup.procs").write_text("0")  # "0": the writing process itself

        yield child, join
    finally:
        child.rmdir()


def run_train(
    *overrides: str, run_dir: Path, timeout: float = 600, env: dict[str, str | None] | None = None
) -> TrainResult:
    """``python train.py overrides... hydra.run.dir=run_dir`` in a clean child process."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(env),
    )
    return TrainResult(proc.returncode, proc.stdout, proc.stderr, run_dir)


def start_train(run_dir: Path, *overrides: str, stderr: Path | None = None) -> subprocess.Popen[bytes]:
    """``python train.py overrides... hydra.run.dir=run_dir`` started, not waited for: in its own
    process group, as a terminal's job, so a signal to the group reaches its ranks too."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if stderr is None else stderr.open("w"),
        env=clean_env(),
        start_new_session=True,
    )


def run_torchrun(
    *overrides: str, nproc: int, run_dir: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> TrainResult:
    """``torchrun --nproc_per_node=N train.py overrides... hydra.run.dir=run_dir``: ranks torchrun starts.

    On a free port: a fixed one may be held by another job on this machine.
    """
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            f"--master_port={free_port()}",
            str(ROOT / "train.py"),
            *overrides,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(env),
    )
    return TrainResult(proc.returncode, proc.stdout, proc.stderr, run_dir)


def cpu_answers_env(*, fp16_kernels: bool = True, half_gemm: bool | None = None) -> dict[str, str]:
    """PYTHONPATH with tests/cpu_answers first: in train.py and every rank, DeepSpeed's CPU
    accelerator answers ``fp16_kernels``, and ladder's 16-bit GEMM probe ``half_gemm`` (None: torch's)."""
    paths = [str(ROOT / "tests" / "cpu_answers"), os.environ.get("PYTHONPATH", "")]
    env = {
        "PYTHONPATH": os.pathsep.join(path for path in paths if path),
        "LADDER_TEST_FP16_KERNELS": "yes" if fp16_kernels else "no",
    }
    if half_gemm is not None:
        env["LADDER_TEST_HALF_GEMM"] = "yes" if half_gemm else "no"
    return env


def run_on_any_gpus(*overrides: str, run_dir: Path, env: dict[str, str] | None = None) -> TrainResult:
    """``run_train``, or ``run_torchrun`` where ``gpus`` exceeds this host's cores (which ladder's
    local launcher refuses: it keeps one rank per core)."""
    gpus = int(next((arg.removeprefix("gpus=") for arg in overrides if arg.startswith("gpus=")), "1"))
    if gpus > (os.cpu_count() or 1):
        return run_torchrun(*overrides, nproc=gpus, run_dir=run_dir, env=env)
    return run_train(*overrides, run_dir=run_dir, env=env)


def run_in_legs(legs: list[list[str]], *common: str, run_dir: Path) -> tuple[TrainResult, list[int | None]]:
    """One run in ``legs``, each on its own layout and ending with ``train.steps=N``: each leg
    checkpoints at its last step and the next resumes from it in the same directory.

    A leg with more ``gpus`` than this host's cores is started by torchrun (run_on_any_gpus).
    Each leg's checkpoint weighs what runner/checkpoint/size.py says, within 2% (the pickled
    records of each tensor, a few hundred bytes apiece, are 1.4% of tiny at half width), and
    so do the copies a leg's move converts.
    Returns the last leg's result and the step each leg resumed from (None: the first).
    """
    from runner.checkpoint.size import config_checkpoint_bytes
    from runner.rundir.disk_room import folder_bytes

    resumed_from: list[int | None] = []
    for number, leg in enumerate(legs):
        steps = int(leg[-1].removeprefix("train.steps="))
        every = f"train.checkpoint_every={steps}"
        resume = ["train.resume=auto"] if number else []
        result = run_on_any_gpus(*leg, *common, every, *resume, run_dir=run_dir)
        assert result.returncode == 0, (leg, result.stderr[-3000:])
        resumed_from.append(result.summary.get("resumed_from_step"))
        written = folder_bytes(run_dir / "checkpoints" / f"step_{steps:08d}")
        planned = config_checkpoint_bytes(compose_config(*leg, *common))
        print(f"{' '.join(leg)}: checkpoint {written:,} bytes, planned {planned:,} ({planned / written:.4f})")
        assert planned == pytest.approx(written, rel=0.02), leg
        # The copies its move to this layout converted, as planned before it started.
        if (moved := result.summary["checkpoint_disk"]["conversion"]) is not None:
            copies = sum(
                folder_bytes(folder)
                for folder in (run_dir / "checkpoints").glob(f"{moved['tag']}_*")
                if folder.is_dir()
            )
            print(f"  converted {copies:,} bytes, planned {moved['bytes']:,} ({moved['bytes'] / copies:.4f})")
            assert moved["bytes"] == pytest.approx(copies, rel=0.02), leg
            # The segment the move began says how long the conversion took and what it wrote.
            measured = result.summary["layout_history"][-1]["conversion"]
            assert measured["bytes"] == copies and measured["seconds"] > 0, (leg, measured)
        # Goodput names the time the moves spent converting (runner/metrics/goodput.py).
        history = result.summary["layout_history"]
        converted = sum(seg["conversion"]["seconds"] for seg in history if seg.get("conversion"))
        assert result.summary["goodput"]["conversion_s"] == pytest.approx(converted), leg
    return result, resumed_from


def compose_config(*overrides: str) -> Any:
    """conf/'s composed, typed TrainConfig for these overrides, as train.py builds it (no run)."""
    from hydra import compose, initialize_config_dir

    from launchers.compose import register_configs, to_train_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=list(overrides)))
