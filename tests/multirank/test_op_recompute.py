"""model.activation_checkpointing=selective: op-level recompute under real DeepSpeed ZeRO-3.

2 CPU ranks, the tiny model, fp32, micro 4 of sequences of 32, 2 micro-batches a step: each block
runs under torch.utils.checkpoint with runner/model/op_recompute.py's policy while ZeRO-3 gathers
its parameters in forward and again in the recompute. Measured: the losses and gradient norms of
the run without recompute, to the last digit, and the ledger's activations as estimated.
"""

from __future__ import annotations

import pytest
from train_helpers import short_run

pytestmark = pytest.mark.multirank

# The run without recompute is the memory ledger's and the loss pieces' (shared).
ZERO3 = (*short_run("zero3", 2), "parallel.param_persistence_threshold=0")


def test_op_level_recompute_keeps_the_experiment_and_what_the_plan_says(trained_once):
    plain = trained_once(*ZERO3)
    selective = trained_once(*ZERO3, "model.activation_checkpointing=selective")
    for a, b in zip(plain.metrics, selective.metrics, strict=True):
        print(f"step {a['step']}: loss {a['loss']:.8f} without recompute, {b['loss']:.8f} selective")
        assert b["loss"] == a["loss"]
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    memory = selective.summary["memory"]
    assert abs(memory["rel_error"]["activations"]) <= 0.02, memory
    kept = memory["measured"]["activations_gb"] / plain.summary["memory"]["measured"]["activations_gb"]
    print(f"activations kept: {kept:.1%} of the run without recompute")
    assert kept < 0.6
