"""A model from a Hugging Face config.json: the same parameters, the same logits, clear refusals.

transformers is the reference: each architecture's tiny model is built by its own classes, on the
meta device to count, and on the CPU to compare logits with ladder's decoder holding its weights.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from train_helpers import ROOT

from launchers.compose import register_configs, to_train_config
from runner.config import ModelConfig, RopeScaling
from runner.errors import ConfigError
from runner.model.hf_config import hf_config_from_model, model_config_from_hf, resolve_hf_model
from runner.model.shape import num_params, param_numels
from runner.model.transformer import build_model

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.unit

CONF = ROOT / "conf"
HF_CONFIGS = CONF / "model" / "hf_configs"
PRESETS = sorted(p.stem for p in HF_CONFIGS.glob("*.json"))

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=300)
# head_dim 16 at theta 5e5: wavelengths 6.3, 32, 167, ... tokens; with original 64 one of each kind
# llama3 scaling treats apart (below 64/4 kept, 16 to 64 blended, above 64 divided by the factor).
LLAMA31_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
)
# Tiny configs of each architecture, with the options that change ladder's decoder.
TINY = {
    "llama3.1": lambda: transformers.LlamaConfig(
        **SHAPE,
        num_key_value_heads=2,
        rope_theta=500000.0,
        rope_scaling=dict(LLAMA31_ROPE),
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
    ),
    "llama3.2-tied": lambda: transformers.LlamaConfig(
        **SHAPE, num_key_value_heads=1, tie_word_embeddings=True, max_position_embeddings=128
    ),
    "mistral": lambda: transformers.MistralConfig(
        **SHAPE, num_key_value_heads=2, sliding_window=48, max_position_embeddings=128
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        **SHAPE, num_key_value_heads=2, rope_theta=1e6, max_position_embeddings=128
    ),
    "qwen2-tied": lambda: transformers.Qwen2Config(
        **SHAPE, num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=128
    ),
}


def _meta_model(hf_config):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf_config)


def _hf_dict(hf_config) -> dict:
    """What save_pretrained writes for the model: the config's keys and its architecture."""
    return {**hf_config.to_dict(), "architectures": [_meta_model(hf_config).__class__.__name__]}


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=overrides))


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_is_its_public_config_and_counts_as_transformers(preset):
    public = json.loads((HF_CONFIGS / f"{preset}.json").read_text())
    model = _compose([f"model={preset}"]).model
    assert model == model_config_from_hf(public, name=preset)
    hf_config = transformers.AutoConfig.for_model(**public)
    assert num_params(model) == _meta_model(hf_config).num_parameters()


@pytest.mark.parametrize("case", sorted(TINY))
def test_tiny_configs_count_as_transformers(case):
    hf_config = TINY[case]()
    cfg = model_config_from_hf(_hf_dict(hf_config), name="hf")
    ladder = build_model(cfg, device="meta")
    assert num_params(cfg) == _meta_model(hf_config).num_parameters()
    assert param_numels(cfg) == [p.numel() for p in ladder.parameters()]


def _ladder_names(hf_name: str) -> str:
    """transformers' Llama/Mistral/Qwen2 parameter name as runner/model/transformer.py names it."""
    renames = [
        (r"^model\.embed_tokens\.", "tok_embeddings."),
        (r"^model\.norm\.", "norm."),
        (r"^lm_head\.", "output."),
        (r"^model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.", r"layers.\1.attention.w\2."),
        (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.", r"layers.\1.feed_forward.w1."),
        (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", r"layers.\1.feed_forward.w2."),
        (r"^model\.layers\.(\d+)\.mlp\.up_proj\.", r"layers.\1.feed_forward.w3."),
        (r"^model\.layers\.(\d+)\.input_layernorm\.", r"layers.\1.attention_norm."),
        (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.ffn_norm."),
    ]
    for pattern, replacement in renames:
        if re.match(pattern, hf_name):
            return re.sub(pattern, replacement, hf_name)
    raise KeyError(hf_name)


@pytest.mark.parametrize("case", ["llama3.1", "mistral", "qwen2", "qwen2-tied"])
def test_logits_equal_transformers_with_the_same_weights(case):
    hf_config = TINY[case]()
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    with torch.no_grad():  # biases and gains away from their initial 0 and 1, so that they count
        for name, param in reference.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.copy_(torch.randn_like(param) * 0.5 + (0 if name.endswith("bias") else 1))
    cfg = model_config_from_hf(_hf_dict(hf_config), name="hf")
    ladder = build_model(cfg).eval()
    state = {_ladder_names(name): tensor for name, tensor in reference.state_dict().items()}
    ladder.load_state_dict(state, strict=not cfg.tie_embeddings)
    tokens = torch.randint(0, cfg.vocab_size, (2, 40))
    with torch.no_grad():
        expected = reference(tokens).logits
        got = ladder(tokens)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_llama3_rope_scaling_changes_the_logits():
    """The parity above is not RoPE-blind: without the scaling the same weights give other logits."""
    cfg = model_config_from_hf(_hf_dict(TINY["llama3.1"]()), name="hf")
    tokens = torch.randint(0, cfg.vocab_size, (1, 40))
    with torch.no_grad():
        scaled = build_model(cfg, seed=1)(tokens)
        plain = build_model(dataclasses.replace(cfg, rope_scaling=RopeScaling.none), seed=1)(tokens)
    assert (scaled - plain).abs().max() > 1e-4


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_hf_config_from_model_loads_in_transformers_as_the_same_model(qkv_bias):
    cfg = ModelConfig(
        name="mine",
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        d_model=64,
        ffn_hidden=96,
        vocab_size=300,
        max_seq_len=256,
        tie_embeddings=qkv_bias,
        rope_theta=5e5,
        rope_scaling=RopeScaling.llama3,
        rope_original_max_seq_len=64,
        qkv_bias=qkv_bias,
    )
    written = hf_config_from_model(cfg)
    assert written["architectures"] == ["Qwen2ForCausalLM" if qkv_bias else "LlamaForCausalLM"]
    hf_config = transformers.AutoConfig.for_model(**written)
    assert _meta_model(hf_config).num_parameters() == num_params(cfg)
    assert model_config_from_hf(written, name="mine") == cfg
    assert model_config_from_hf(_hf_dict(hf_config), name="mine") == cfg


def test_a_sliding_window_caps_max_seq_len_where_it_would_start_to_slide():
    cfg = model_config_from_hf(_hf_dict(TINY["mistral"]()), name="hf")
    assert cfg.max_seq_len == 48  # the window, not max_position_embeddings=128
    qwen = {**_hf_dict(TINY["qwen2"]()), "sliding_window": 48, "layer_types": None}
    assert model_config_from_hf(qwen, name="hf").max_seq_len == 128  # use_sliding_window=false: none
    sliding = {**qwen, "use_sliding_window": True, "max_window_layers": 1}
    assert model_config_from_hf(sliding, name="hf").max_seq_len == 48


def _refusal(hf: dict) -> str:
    with pytest.raises(ConfigError) as info:
        model_config_from_hf(hf, name="hf")
    return str(info.value)


def test_an_unsupported_architecture_is_refused_listing_the_supported():
    hf = {**_hf_dict(TINY["llama3.1"]()), "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}
    text = _refusal(hf)
    assert "architectures=['GPT2LMHeadModel']" in text
    assert "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM" in text


@pytest.mark.parametrize(
    ("case", "change", "fragments"),
    [
        ("llama3.1", {"hidden_act": "gelu"}, ["hidden_act='gelu'", "silu"]),
        ("llama3.1", {"attention_bias": True}, ["attention_bias=True", "attention_bias=false"]),
        ("llama3.1", {"mlp_bias": True}, ["mlp_bias=True"]),
        ("llama3.1", {"pretraining_tp": 2}, ["pretraining_tp=2", "set it to 1"]),
        ("mistral", {"head_dim": 32}, ["head_dim=32", "64/4"]),
        ("qwen2", {"attention_dropout": 0.1}, ["attention_dropout=0.1", "0.0"]),
        ("qwen2", {"use_mrope": True}, ["use_mrope=true"]),
        (
            "llama3.1",
            {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
            ["rope_parameters.rope_type='yarn'", "llama3"],
        ),
        ("llama3.1", {"quantization_config": {"bits": 4}}, ["quantization_config={'bits': 4}", "remove it"]),
        ("qwen2", {"layer_types": ["full_attention", "chunked_attention"]}, ["'chunked_attention'"]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_key_that_changes_the_math_is_refused_with_its_value(case, change, fragments):
    text = _refusal({**_hf_dict(TINY[case]()), **change})
    for fragment in fragments:
        assert fragment in text, text


def test_model_keys_the_file_sets_may_not_be_set_again(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_hf_dict(TINY["qwen2"]())))
    base = ModelConfig(name="hf", hf_config=str(tmp_path))  # a directory: its config.json
    resolved = resolve_hf_model(dataclasses.replace(base, max_seq_len=64))
    assert (resolved.d_model, resolved.qkv_bias, resolved.max_seq_len) == (64, True, 64)
    with pytest.raises(ConfigError, match=r"model.n_layer=12 is set, but model.hf_config=.* sets it to 2"):
        resolve_hf_model(dataclasses.replace(base, n_layer=12))
    with pytest.raises(ConfigError, match=r"model.max_seq_len=4096 exceeds the 128 positions"):
        resolve_hf_model(dataclasses.replace(base, max_seq_len=4096))
