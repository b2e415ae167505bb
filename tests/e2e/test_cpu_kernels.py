"""What a CPU's 16-bit kernels decide, both ways on every host.

precision=fp16 trains where the CPU has fp16 kernels and is refused before launch where it
has none; bf16 matmuls run on torch's kernels, or in fp32 rounded once where torch has no bf16
kernels for the CPU. Each expectation comes from the probe ladder itself asks
(runner/preflight/validate.py ``fp16_supported``: DeepSpeed's CPU accelerator;
runner/hardware/cpu_half_matmul.py ``native_half_matmul``). The host's own answer runs as it
is; the other answer is forced by tests/cpu_answers, so a CPU with AVX512-FP16 or AMX-FP16
meets the refusal and one without them trains fp16, and each host trains bf16 both ways.
"""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import TrainResult, cpu_answers_env, run_train

from runner.hardware.cpu_half_matmul import computes_in_fp32
from runner.preflight.validate import fp16_supported

pytestmark = pytest.mark.e2e

STEPS = 7
# tests/multirank/test_fp16_layouts.py's experiment on one rank: the dynamic loss scale starts
# at 2^16, step 0 overflows and is skipped, and 3 steps without an overflow double it back.
FP16_RUN = (
    "precision=fp16",
    "precision.loss_scale_window=3",
    "batch.global_size=16",
    "batch.micro_size=4",
    "data.seq_len=16",
    "optimizer.lr=1e-3",
    "model.d_model=128",
    "model.ffn_hidden=344",
    "logger=none",
    f"train.steps={STEPS}",
)
SCALES = [2.0**16] + [2.0**15] * 4 + [2.0**16] * 2


@pytest.fixture(scope="module")
def by_answer(tmp_path_factory) -> dict[bool, TrainResult]:
    """The run under this host's own answer, and under the other one forced: keyed by the answer."""
    root = tmp_path_factory.mktemp("fp16_kernels")
    host = fp16_supported()
    print(f"this host's CPU has fp16 kernels (DeepSpeed's CPU accelerator): {host}")
    return {
        host: run_train(*FP16_RUN, run_dir=root / "host"),
        not host: run_train(*FP16_RUN, run_dir=root / "forced", env=cpu_answers_env(fp16_kernels=not host)),
    }


def test_fp16_trains_with_a_loss_scale_that_skips_and_grows_where_the_cpu_has_fp16_kernels(by_answer):
    result = by_answer[True]
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = result.metrics
    assert [m["train/loss_scale"] for m in metrics] == SCALES
    assert [not math.isfinite(float(m["grad_norm"])) for m in metrics] == [True] + [False] * (STEPS - 1)
    assert result.summary["fp16_loss_scale"] == {"final_scale": 2.0**16, "overflow_steps": [0]}
    assert metrics[-1]["loss"] < metrics[1]["loss"] - 0.5  # it trains


def test_fp16_is_refused_before_launch_where_the_cpu_has_none(by_answer):
    result = by_answer[False]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "precision=fp16: this host has no CUDA device and its CPU no fp16 kernels" in result.stderr
    assert "use precision=bf16" in result.stderr
    assert "Traceback" not in result.stderr
    assert not result.run_dir.exists(), "a refused run leaves no directory behind"


# Two bf16 steps of tiny: the rank says how it multiplies, and the MFU peak says how it was measured.
BF16_RUN = (
    "precision=bf16",
    "batch.global_size=8",
    "batch.micro_size=4",
    "data.seq_len=32",
    "logger=none",
    "train.steps=2",
)
WIDENED = "bf16 matmuls computed in fp32 and rounded to bf16"


@pytest.fixture(scope="module")
def bf16_by_widened(tmp_path_factory) -> dict[bool, TrainResult]:
    """bf16 under this host's answer and under the other one forced: keyed by "computed in fp32"."""
    root = tmp_path_factory.mktemp("half_gemm")
    widened = computes_in_fp32(torch.bfloat16)
    print(f"this host computes bf16 matmuls in fp32 (no oneDNN bf16 kernels): {widened}")
    return {
        widened: run_train(*BF16_RUN, run_dir=root / "host"),
        not widened: run_train(*BF16_RUN, run_dir=root / "forced", env=cpu_answers_env(half_gemm=widened)),
    }


@pytest.mark.parametrize("widened", [True, False], ids=["in fp32", "torch's kernels"])
def test_bf16_matmuls_say_how_they_were_computed(bf16_by_widened, widened):
    result = bf16_by_widened[widened]
    assert result.returncode == 0, result.stderr[-3000:]
    assert (WIDENED in result.stderr) == widened
    assert ("bf16 matmuls computed in fp32" in result.summary["peak_flops_source"]) == widened
    assert all(math.isfinite(m["loss"]) for m in result.metrics)


def test_bf16_in_fp32_trains_as_torchs_kernels_do(bf16_by_widened):
    """The same model and batches: each matmul rounded once either way, so the losses agree to bf16."""
    widened, native = ([m["loss"] for m in bf16_by_widened[answer].metrics] for answer in (True, False))
    print(f"bf16 losses, in fp32: {widened}, torch's kernels: {native}")
    assert widened == pytest.approx(native, rel=1e-3)
