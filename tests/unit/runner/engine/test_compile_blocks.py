"""train.compile=true: every block compiled in place, the same names, the same numbers."""

from __future__ import annotations

import pytest
import torch

from runner.config import ModelConfig
from runner.engine.compile_blocks import compile_blocks, compile_summary
from runner.model.transformer import Transformer, lm_loss

pytestmark = pytest.mark.unit


def _loss_and_grads(model: Transformer, tokens: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_compiled_blocks_keep_the_names_and_give_the_eager_loss_and_gradients():
    cfg = ModelConfig(n_layer=2, d_model=64, n_head=4, ffn_hidden=128, vocab_size=97, max_seq_len=32)
    eager, compiled = Transformer(cfg, seed=0), Transformer(cfg, seed=0)
    names = list(compiled.state_dict())

    assert compile_blocks(compiled) == cfg.n_layer
    assert list(compiled.state_dict()) == names  # checkpoints and ZeRO see the same model

    tokens = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    loss_eager, grads_eager = _loss_and_grads(eager, tokens)
    loss_compiled, grads_compiled = _loss_and_grads(compiled, tokens)
    assert loss_compiled == pytest.approx(loss_eager, abs=1e-5)
    for name, grad in grads_eager.items():
        torch.testing.assert_close(grads_compiled[name], grad, atol=1e-5, rtol=1e-4, msg=name)

    summary = compile_summary(cfg.n_layer)
    assert summary["blocks"] == cfg.n_layer
    assert summary["graph_breaks"] == 0, summary["top_break_reasons"]
