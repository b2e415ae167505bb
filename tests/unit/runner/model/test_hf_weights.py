"""model.init_from reads a transformers model's weights into ladder's decoder: whole, as ZeRO-3
partitions and as tensor-parallel shards, for Llama, Mistral and Qwen2."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from runner.model import hf_weights
from runner.model.hf_config import model_config_from_hf, read_hf_config
from runner.model.hf_names import hf_name
from runner.model.meta import materialize
from runner.model.transformer import build_model
from runner.parallel.shard_build import write_initial_weights

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.unit, pytest.mark.hf]

SHAPE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=64,
)
ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"tie_word_embeddings": True}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"use_sliding_window": False}),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A tiny model of one architecture with random weights (biases too), saved by save_pretrained."""
    config_class, model_class, extra = ARCHS[request.param]
    torch.manual_seed(0)
    model = model_class(config_class(**SHAPE, **extra)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    cfg = model_config_from_hf(read_hf_config(str(folder)), name="hf")
    return model, dataclasses.replace(cfg, init_from=str(folder))


def test_whole_model_reads_transformers_weights_and_gives_its_logits(saved):
    reference, cfg = saved
    assert hf_weights.init_from_problems(cfg) == []
    model = build_model(cfg, device="meta")
    materialize(model, torch.device("cpu"))
    write_initial_weights(model, cfg, seed=0)
    model.init_rope(torch.device("cpu"))
    tokens = torch.randint(0, SHAPE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(tokens) - reference(tokens).logits).abs().max().item() <= 1e-4


def test_partitions_and_column_shards_are_the_files_slices(saved, monkeypatch):
    """A ZeRO-3 partition (a flat range crossing rows) and a row-parallel shard (columns), read in
    bands of a few rows as a large model's would be."""
    reference, cfg = saved
    monkeypatch.setattr(hf_weights, "DRAW_BLOCK", 100)
    whole = dict(reference.named_parameters())
    for name in (
        "tok_embeddings.weight",
        "layers.1.feed_forward.w2.weight",
        "layers.0.attention_norm.weight",
    ):
        expected = whole[hf_name(name)].detach()
        shape = tuple(expected.shape)
        start, stop = 37, math.prod(shape) - 5
        part = torch.empty(stop - start)
        hf_weights.write_values(part, cfg, name, shape, seed=0, start=start)
        assert torch.equal(part, expected.reshape(-1)[start:stop]), name
        if len(shape) == 2:
            columns = torch.empty(shape[0], shape[1] // 2)
            hf_weights.write_shard(columns, cfg, name, shape, seed=0, dim=1, start=shape[1] // 2)
            assert torch.equal(columns, expected[:, shape[1] // 2 :]), name


def test_a_missing_tensor_and_a_wrong_shape_are_named_with_both_shapes(saved):
    _, cfg = saved
    wider = dataclasses.replace(cfg, ffn_hidden=128)
    problems = hf_weights.init_from_problems(wider)
    assert any(
        "model.layers.0.mlp.gate_proj.weight has shape (96, 64), this model's (128, 64)" in p
        for p in problems
    ), problems
    # every layer's three MLP weights: one line, the first three, the count of the rest, one fix
    (misshapen,) = [p for p in problems if "has shape" in p]
    assert misshapen.count("has shape") == hf_weights.SHOWN_TENSORS
    assert f"(and {3 * cfg.n_layer - 3} more tensors of other shapes)" in misshapen
    assert misshapen.count("model.hf_config") == 1
    untied = dataclasses.replace(cfg, tie_embeddings=not cfg.tie_embeddings)
    said = "\n".join(hf_weights.init_from_problems(untied))
    assert "lm_head.weight" in said and "model.hf_config" in said
