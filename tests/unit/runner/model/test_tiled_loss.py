"""model.loss_tiles: the head and loss in pieces of the sequence give the whole loss and its gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runner.config import ModelConfig, Recompute
from runner.model.transformer import build_model, lm_loss
from runner.rules import loss_tile_count

pytestmark = pytest.mark.unit

# The tiny model (tied head) at a vocabulary wide enough that the logits outweigh a block.
SMALL = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=172, vocab_size=1000)
MICRO, SEQ = 3, 50
SAME = 1e-6  # the loss, relative: the pieces sum the tokens' losses in another order
# A gradient, relative to its largest element: the head's weight gradient sums 150 tokens'
# products in pieces; measured up to 1.1e-6 (a tied embedding), a few units of fp32's 6e-8.
GRAD_SAME = 1e-5


def _loss_and_grads(
    cfg: ModelConfig, tokens: torch.Tensor, *, whole: bool
) -> tuple[float, dict[str, torch.Tensor]]:
    model = build_model(cfg, seed=0).train()
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    loss = lm_loss(model(inputs), targets) if whole else model(inputs, targets)
    loss.backward()
    return float(loss), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("recompute", [Recompute.none, Recompute.full])
@pytest.mark.parametrize("tiles", [2, 3, 7, SEQ])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_pieces_give_the_whole_loss_and_gradients(tiles: int, recompute: Recompute, tied: bool) -> None:
    """50 tokens in 3 pieces are 17, 17 and 16; in 7, six of 8 and one of 2; in 50, one token each."""
    cfg = dataclasses.replace(
        SMALL, loss_tiles=tiles, activation_checkpointing=recompute, tie_embeddings=tied
    )
    tokens = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(1))
    whole, whole_grads = _loss_and_grads(cfg, tokens, whole=True)
    pieces, piece_grads = _loss_and_grads(cfg, tokens, whole=False)
    assert pieces == pytest.approx(whole, rel=SAME)
    for name, grad in whole_grads.items():
        worst = float((piece_grads[name] - grad).abs().max() / grad.abs().max())
        assert worst <= GRAD_SAME, (name, worst)


def test_evaluation_runs_the_pieces_without_keeping_anything() -> None:
    """Under no_grad (runner/train/evaluation.py) the pieces need no checkpoint, and give the same loss."""
    cfg = dataclasses.replace(SMALL, loss_tiles=4)
    model = build_model(cfg, seed=0).eval()
    tokens = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        pieces = model(tokens[:, :-1], tokens[:, 1:])
        whole = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    assert not pieces.requires_grad
    assert float(pieces) == pytest.approx(float(whole), rel=SAME)


def test_auto_takes_pieces_of_at_most_a_gib_of_fp32_logits() -> None:
    """null: whole below 1 GiB (the tiny model's 0.1 MB); Llama 3's vocabulary at 32K tokens in 16."""
    llama3 = dataclasses.replace(SMALL, vocab_size=128256)
    assert loss_tile_count(ModelConfig(), micro_size=8, seq_len=128) == 1
    assert loss_tile_count(llama3, micro_size=1, seq_len=32768) == 16  # 15.7 GiB of fp32 logits
    assert loss_tile_count(llama3, micro_size=1, seq_len=2048) == 1  # 0.98 GiB
    assert loss_tile_count(llama3, micro_size=2, seq_len=2048) == 2  # 1.96 GiB
    # tp keeps DeepSpeed's vocabulary-parallel loss, the pipeline its own loss call: whole.
    assert loss_tile_count(llama3, micro_size=1, seq_len=32768, tp=2) == 1
    assert loss_tile_count(llama3, micro_size=1, seq_len=32768, pp=2) == 1
    # A set count is taken as it is, and never more pieces than tokens.
    assert loss_tile_count(dataclasses.replace(llama3, loss_tiles=1), micro_size=1, seq_len=32768) == 1
    assert loss_tile_count(dataclasses.replace(SMALL, loss_tiles=64), micro_size=1, seq_len=16) == 16
