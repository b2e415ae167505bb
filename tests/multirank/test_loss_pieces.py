"""model.loss_tiles: a loss in pieces trains the whole loss's experiment under real DeepSpeed.

2 CPU ranks, the tiny model with its tied head, fp32, micro 4 of sequences of 32 with 2
micro-batches a step: the head's weight is the embedding's, so its gradient comes from the
pieces and from the lookup, and ZeRO reduces it once per step. 3 pieces of 32 tokens are 11,
11 and 10. Measured: the losses and gradient norms of ZeRO-2 and ZeRO-3 equal the whole loss's
to 1e-7 or better.
"""

from __future__ import annotations

import pytest
from train_helpers import short_run

pytestmark = pytest.mark.multirank

# The whole-loss runs are the memory ledger's (tests/multirank/test_memory_ledger.py), shared.
LAYOUTS = {
    "zero2": short_run("zero2", 2),
    "zero3": (*short_run("zero3", 2), "parallel.param_persistence_threshold=0"),
}
PIECES = 3
SAME = 1e-6  # relative: the pieces sum the tokens' losses in another order


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_loss_in_pieces_trains_the_whole_losss_experiment(trained_once, layout):
    whole = trained_once(*LAYOUTS[layout])
    pieces = trained_once(*LAYOUTS[layout], f"model.loss_tiles={PIECES}")
    assert [m["step"] for m in pieces.metrics] == [m["step"] for m in whole.metrics]
    for a, b in zip(whole.metrics, pieces.metrics, strict=True):
        print(f"{layout} step {a['step']}: loss {a['loss']:.8f} whole, {b['loss']:.8f} in {PIECES} pieces")
        assert b["loss"] == pytest.approx(a["loss"], rel=SAME)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=SAME)
    # The ledger: no (tokens, vocab) log-probabilities kept, and the estimate still the measurement.
    memory = pieces.summary["memory"]
    assert abs(memory["rel_error"]["activations"]) <= 0.02, memory
    kept_less = whole.summary["memory"]["measured"]["activations_gb"] - memory["measured"]["activations_gb"]
    log_probs_gb = 4 * 4 * 32 * 256 / 1e9  # fp32, micro 4 x 32 tokens x 256 ids
    assert kept_less == pytest.approx(log_probs_gb, rel=0.05)
    assert pieces.summary["device_memory_plan"]["loss_tiles"] == PIECES
    assert whole.summary["device_memory_plan"]["loss_tiles"] == 1  # auto: 0.1 MB of logits run whole
