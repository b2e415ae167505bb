"""The measured ledger agrees with the estimate: 2% for model states, 15% for activations, 1% for host memory.

Real DeepSpeed on CPU, ZeRO 0-3 and ZeRO-Offload, 1 and 2 ranks, the tiny model in fp32 and
bf16, AdamW and (one case) SGD.
"""

from __future__ import annotations

from typing import Any

import pytest
from train_helpers import TrainResult, assert_mfu_within_the_calibrated_peak, short_run

from runner.hardware.cpu_half_matmul import computes_in_fp32
from runner.hardware.peak_flops import torch_dtype
from runner.metrics.ledger import host_relative_errors

pytestmark = pytest.mark.multirank

TOLERANCE = {"params": 0.02, "grads": 0.02, "optimizer": 0.02, "activations": 0.15}
# ZeRO-Offload's host memory per rank (offloaded terms and DeepSpeed's own host buffers),
# each line and the total: measured within 2e-4 (rank 0 holds a whole straddling tensor).
HOST_TOLERANCE = 0.01

CASES = [
    ("ddp", 2, "fp32", "adamw"),
    ("zero1", 2, "bf16", "adamw"),
    ("zero2", 2, "fp32", "adamw"),
    ("zero3", 2, "bf16", "adamw"),
    ("zero3", 1, "fp32", "sgd"),  # momentum is SGD's one state (4 bytes a parameter)
    ("ddp", 1, "bf16", "adamw"),
    ("zero2_offload", 1, "bf16", "adamw"),
    ("zero3_offload", 1, "fp32", "adamw"),
    ("zero3_offload", 2, "bf16", "adamw"),
]


def _gb(values: dict[str, Any]) -> dict[str, float]:
    """summary.json's ``<name>_gb`` numbers by name."""
    return {name.removesuffix("_gb"): value for name, value in values.items() if name.endswith("_gb")}


@pytest.mark.parametrize(("parallel", "gpus", "precision", "optimizer"), CASES)
def test_measured_terms_match_the_estimate(trained_once, parallel, gpus, precision, optimizer):
    result = trained_once(*short_run(parallel, gpus, precision, optimizer))
    _check_ledger(result, parallel)
    # On a CPU without bf16 GEMM kernels the bf16 runs computed their matmuls in fp32 and
    # divided by a peak measured so (runner/hardware/cpu_half_matmul.py); the ledger is the same.
    widened = computes_in_fp32(torch_dtype(precision))
    assert ("bf16 matmuls computed in fp32" in result.summary["peak_flops_source"]) == widened
    assert ("bf16 matmuls computed in fp32 and rounded to bf16" in result.stderr) == widened


def _check_ledger(result: TrainResult, parallel: str) -> None:
    """Each term, residual line and host line of the run's ledger against its estimate."""
    memory = result.summary["memory"]
    for term, tolerance in TOLERANCE.items():
        error = memory["rel_error"][term]
        assert error is not None and abs(error) <= tolerance, (term, memory)
    # What DeepSpeed holds beyond the textbook is shown as named lines, estimated alike.
    measured_residual = memory["measured"]["residual"]
    for name, gb in memory["estimated"]["residual"].items():
        assert measured_residual.get(name) == pytest.approx(gb, rel=0.02), name
    # Offload: host memory is the offloaded terms plus DeepSpeed's own buffers, and the
    # ledger shows all of it; without offload there is none.
    host = _gb(memory["offloaded_to_host"])
    assert bool(host) == parallel.endswith("_offload"), host
    if host:
        errors = memory["host_rel_error"]
        assert errors == pytest.approx(
            host_relative_errors(host, _gb(memory["measured"]), _gb(measured_residual))
        )
        for name, error in errors.items():
            assert error is not None and abs(error) <= HOST_TOLERANCE, (name, errors, memory)
    assert_mfu_within_the_calibrated_peak(result)
    metrics = result.metrics[-1]
    for term in TOLERANCE:
        assert f"memory/est/{term}_gb" in metrics
        assert f"memory/measured/{term}_gb" in metrics
    # A rank's host memory: the plan's figure beside the process's high-water mark, which on
    # a CPU rank holds at least the model states the ledger measured in it.
    host_memory = result.summary["host_memory"]
    assert host_memory["planned_per_rank_gb"] > 0
    states = sum(memory["measured"][f"{term}_gb"] for term in ("params", "grads", "optimizer"))
    assert host_memory["measured_per_rank_gb"] == metrics["memory/host_peak_gb"] > states


def test_offload_without_accumulation_has_no_cpu_accumulation_buffer(trained_once):
    """ZeRO-2 offload keeps whole gradients on the host only to accumulate them: accum 1 has none.

    2 ranks, fp32, micro 8: the ledger's checks above hold here too.
    """
    result = trained_once(*short_run("zero2_offload", 2), "batch.micro_size=8")
    _check_ledger(result, "zero2_offload")
    memory = result.summary["memory"]
    assert result.summary["layout"]["accum_steps"] == 1
    assert "accumulated_grads_in_cpu_gb" not in memory["offloaded_to_host"]
    assert "accumulated_grads_in_cpu_gb" not in memory["measured"]["residual"]


def test_zero3_shards_what_ddp_replicates(trained_once):
    """On 2 ranks, stage 3 holds about half of DDP's params, grads and optimizer states."""
    ddp = trained_once(*short_run("ddp", 2))
    zero3 = trained_once(*short_run("zero3", 2), "parallel.param_persistence_threshold=0")
    full = ddp.summary["memory"]["measured"]
    shard = zero3.summary["memory"]["measured"]
    for term in ("params", "grads", "optimizer"):
        assert shard[f"{term}_gb"] == pytest.approx(full[f"{term}_gb"] / 2, rel=0.02), term


def test_a_compiled_block_is_estimated_as_the_graph_saves_it(train):
    """train.compile=true on one rank: the estimate counts what one compiled block saves, not eager's."""
    result = train(
        "parallel=ddp", "gpus=1", "batch.micro_size=4", "train.steps=2", "train.compile=true", "logger=none"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    memory = result.summary["memory"]
    # Measured: 0.0379392 GB estimated, 0.0379392 GB saved (the eager items would say 0.0478).
    assert abs(memory["rel_error"]["activations"]) <= 0.01, memory
