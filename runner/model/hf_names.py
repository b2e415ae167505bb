"""ladder's parameter names as Hugging Face's Llama, Mistral and Qwen2 name them, and the shapes
a model's safetensors files hold.

runner/model/transformer.py names its modules after Meta's reference (``tok_embeddings``,
``layers.{i}.attention.wq``, ``feed_forward.w1``); transformers' ``LlamaForCausalLM``
(models/llama/modeling_llama.py, and Mistral's and Qwen2's, which share its names) calls the
same tensors ``model.embed_tokens``, ``model.layers.{i}.self_attn.q_proj``, ``mlp.gate_proj``.
The tensors themselves are the same, laid out (out_features, in_features) on both sides; RoPE
rotates the same channel pairs ("rotate half"), so no permutation of wq or wk is needed.
A tied head is one tensor: transformers saves ``embed_tokens`` only (``tie_word_embeddings``).
"""

from __future__ import annotations

import re

import torch

from runner.config import ModelConfig
from runner.model.transformer import build_model

# Inside a block: ladder's module path -> transformers'.
_BLOCK = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_IN_BLOCK = re.compile(r"layers\.(\d+)\.(.+)\.(weight|bias)")


def hf_name(name: str) -> str:
    """Hugging Face's name of ladder's parameter ``name`` (``layers.0.attention.wq.bias`` ->
    ``model.layers.0.self_attn.q_proj.bias``)."""
    if name in _TOP:
        return _TOP[name]
    match = _IN_BLOCK.fullmatch(name)
    if match is None or match.group(2) not in _BLOCK:
        raise ValueError(f"{name}: no Hugging Face name is known for this parameter")
    layer, module, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK[module]}.{kind}"


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor a Hugging Face directory of ``cfg``'s model holds, by its HF name: ladder's
    name and the shape, in ladder's order (a tied head once, as the embedding)."""
    with torch.device("meta"):
        module = build_model(cfg, device="meta")  # shapes only
    return {hf_name(name): (name, tuple(p.shape)) for name, p in module.named_parameters()}
