"""model.mlp_tiles: the MLP in pieces (DeepSpeed's TiledMLP) gives the whole loss and gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runner.config import ModelConfig, Recompute
from runner.model.transformer import build_model
from runner.rules import mlp_tile_count

pytestmark = pytest.mark.unit

SMALL = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=172, vocab_size=1000)
MICRO, SEQ = 3, 50
SAME = 1e-6  # the loss, relative: the pieces compute every token's MLP output as the whole does
# A gradient, relative to its largest element: w1, w2 and w3's gradients sum 150 tokens' products
# in pieces; measured up to 7.0e-7 (50 pieces), a few units of fp32's 6e-8.
GRAD_SAME = 1e-5


def _loss_and_grads(cfg: ModelConfig, tokens: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model = build_model(cfg, seed=0).train()
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    return float(loss.detach()), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("recompute", list(Recompute))
@pytest.mark.parametrize("tiles", [2, 7, SEQ])
def test_pieces_give_the_whole_loss_and_gradients(tiles: int, recompute: Recompute) -> None:
    """Every recompute mode: the MLP whole and in 2, 7 and 50 pieces of 150 tokens, fp32."""
    cfg = dataclasses.replace(SMALL, activation_checkpointing=recompute)
    tokens = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(1))
    whole, whole_grads = _loss_and_grads(cfg, tokens)
    pieces, piece_grads = _loss_and_grads(dataclasses.replace(cfg, mlp_tiles=tiles), tokens)
    assert pieces == pytest.approx(whole, rel=SAME)
    for name, grad in whole_grads.items():
        worst = float((piece_grads[name] - grad).abs().max() / grad.abs().max())
        assert worst <= GRAD_SAME, (name, worst)


def test_pieces_run_through_deepspeeds_tiled_mlp() -> None:
    """The MLP's output comes from TiledMLP's autograd function, and the loss in evaluation is the same."""
    cfg = dataclasses.replace(SMALL, mlp_tiles=4)
    model = build_model(cfg, seed=0).train()
    x = torch.randn(MICRO, SEQ, cfg.d_model, requires_grad=True)
    assert type(model.layers[0].feed_forward(x).grad_fn).__name__ == "TiledMLPBackward"
    tokens = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        pieces = float(model.eval()(tokens[:, :-1], tokens[:, 1:]))
        whole = float(build_model(SMALL, seed=0).eval()(tokens[:, :-1], tokens[:, 1:]))
    assert pieces == pytest.approx(whole, rel=SAME)


def test_the_count_is_the_pieces_torch_chunk_makes() -> None:
    """TiledMLP marks a weight's gradient ready for ZeRO at piece ``shards - 1``: hand it no more
    pieces than torch.chunk makes of the tokens, or the last piece is never marked."""
    assert mlp_tile_count(dataclasses.replace(SMALL, mlp_tiles=4), tokens=6) == 3  # pieces of 2
    assert len(torch.arange(6).chunk(4)) == 3
    assert mlp_tile_count(dataclasses.replace(SMALL, mlp_tiles=7), tokens=150) == 7  # 6 of 22, one of 18
    assert mlp_tile_count(dataclasses.replace(SMALL, mlp_tiles=64), tokens=16) == 16
    assert mlp_tile_count(SMALL, tokens=150) == 1
