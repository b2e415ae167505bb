"""A Hugging Face ``config.json`` as ladder's decoder shape, and ladder's shape as a ``config.json``.

``model=hf model.hf_config=PATH`` reads the file (or PATH/config.json) before launch, as plain
JSON: no weights, no network, no transformers. Three architectures are the same decoder as
runner/model/transformer.py up to their options: ``LlamaForCausalLM`` (Llama 2, 3, 3.1, 3.2),
``MistralForCausalLM`` and ``Qwen2ForCausalLM`` (biases on q, k and v). Every key of the file
either maps onto a ``model.*`` key, is checked to sit at a value that leaves the forward pass as
ladder computes it, or is one that never touches the math (token ids, dtype, cache); anything
else is refused with the key, its value and the fix, so that no option silently changes what
ladder trains.

Field meanings and defaults are transformers 5's (models/llama/configuration_llama.py,
models/mistral/configuration_mistral.py, models/qwen2/configuration_qwen2.py, and
modeling_rope_utils.py for RoPE); configs written by transformers 4 (``rope_theta`` and
``rope_scaling`` at the top level) read the same.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from runner.config import ModelConfig, RopeScaling
from runner.errors import ConfigError
from runner.model.shape import n_kv_head
from runner.rundir.json_types import JsonObject

LLAMA, MISTRAL, QWEN2 = "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"
MODEL_TYPES = {LLAMA: "llama", MISTRAL: "mistral", QWEN2: "qwen2"}
SUPPORTED = tuple(MODEL_TYPES)

# The keys each shape needs; HF's classes have defaults for them, but every real config.json
# carries them, and a default guessed here could give another model.
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")

# Defaults of the optional keys that change the shape, per architecture (transformers 5's
# configuration_<type>.py class attributes; num_key_value_heads None: as many as query heads).
DEFAULTS: dict[str, dict[str, int | None]] = {
    LLAMA: {"num_key_value_heads": None, "max_position_embeddings": 2048},
    MISTRAL: {"num_key_value_heads": 8, "max_position_embeddings": 131072},
    QWEN2: {"num_key_value_heads": 32, "max_position_embeddings": 32768},
}
COMMON_DEFAULTS: dict[str, float | bool] = {
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "rope_theta": 10000.0,  # modeling_rope_utils.py RotaryEmbeddingConfigMixin.default_theta
}

# Keys that never change the forward pass or the initial weights' distribution: identity, token
# ids, dtype, generation cache, outputs a caller asks for.
INERT = frozenset(
    {
        "_name_or_path",
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "tokenizer_class",
        "chunk_size_feed_forward",
        "id2label",
        "label2id",
        "is_encoder_decoder",
        "output_attentions",
        "output_hidden_states",
        "problem_type",
        "return_dict",
    }
)
# Keys read below, each mapped onto a model.* key or checked at its neutral value.
MAPPED = frozenset(
    {
        *REQUIRED,
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "tie_word_embeddings",
        "initializer_range",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",
        "hidden_act",
        "head_dim",
        "attention_dropout",
        "attention_bias",
        "mlp_bias",
        "pretraining_tp",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "use_mrope",
    }
)
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
ROPE_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor", *LLAMA3_KEYS})

# The model.* key each config.json key sets: a command line that sets one of these as well is refused.
SETS = {
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_kv_head": "num_key_value_heads",
    "d_model": "hidden_size",
    "ffn_hidden": "intermediate_size",
    "vocab_size": "vocab_size",
    "tie_embeddings": "tie_word_embeddings",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "rope_scaling_factor": "rope_scaling",
    "rope_low_freq_factor": "rope_scaling",
    "rope_high_freq_factor": "rope_scaling",
    "rope_original_max_seq_len": "rope_scaling",
    "qkv_bias": "architectures",
}


def read_hf_config(path: str) -> dict[str, Any]:
    """The JSON object in ``path``: a config.json, or a model directory holding one."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise ConfigError(
            f"  - model.hf_config={path}: no such file; give a config.json or the model directory holding one"
        )
    try:
        hf = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"  - model.hf_config={path}: not a JSON file ({error})") from error
    if not isinstance(hf, dict):
        raise ConfigError(
            f"  - model.hf_config={path}: holds a JSON {type(hf).__name__}, not a config object"
        )
    return hf


def architecture(hf: dict[str, Any], *, source: str = "config.json") -> str:
    """The supported architecture ``hf`` names (``architectures``, else ``model_type``); refuses others."""
    names = hf.get("architectures")
    by_type = {model_type: arch for arch, model_type in MODEL_TYPES.items()}
    if names is None and hf.get("model_type") in by_type:
        return by_type[hf["model_type"]]
    if isinstance(names, list) and len(names) == 1 and names[0] in MODEL_TYPES:
        return str(names[0])
    given = f"architectures={names!r}" if names is not None else f"model_type={hf.get('model_type')!r}"
    raise ConfigError(
        f"  - {source}: {given}: ladder's decoder reads only {', '.join(SUPPORTED)} "
        f"(model_type {', '.join(MODEL_TYPES.values())}); use a config.json of one of them"
    )


def _get(hf: dict[str, Any], arch: str, key: str) -> Any:
    value = hf.get(key)
    if value is not None:
        return value
    return DEFAULTS[arch].get(key, COMMON_DEFAULTS.get(key))


def _rope(hf: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """The model.rope_* keys from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (transformers 4); types other than default and llama3 refused."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    where = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        problems.append(f"{where}={params!r}: one RoPE for every layer is all ladder's decoder has")
        return {}
    for key in sorted(set(params) - ROPE_KEYS):
        problems.append(f"{where}.{key}={params[key]!r}: not a key of the default or llama3 RoPE")
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        problems.append(
            f"partial_rotary_factor={partial!r}: ladder's RoPE rotates every channel; use 1.0 or remove it"
        )
    theta = params.get("rope_theta", hf.get("rope_theta")) or COMMON_DEFAULTS["rope_theta"]
    kind = params.get("rope_type", params.get("type", "default"))
    out: dict[str, Any] = {"rope_theta": float(theta), "rope_scaling": RopeScaling.none}
    if kind == "default":
        return out
    if kind != "llama3":
        problems.append(
            f"{where}.rope_type={kind!r}: ladder's RoPE scales by llama3 only (or none: default); "
            "use a model without it"
        )
        return out
    original = params.get("original_max_position_embeddings", hf.get("max_position_embeddings"))
    missing = [key for key in LLAMA3_KEYS[:3] if params.get(key) is None]
    if missing or original is None:
        problems.append(f"{where}: llama3 scaling needs {', '.join(missing or LLAMA3_KEYS[3:])}")
        return out
    return {
        **out,
        "rope_scaling": RopeScaling.llama3,
        "rope_scaling_factor": float(params["factor"]),
        "rope_low_freq_factor": float(params["low_freq_factor"]),
        "rope_high_freq_factor": float(params["high_freq_factor"]),
        "rope_original_max_seq_len": int(original),
    }


def sliding_window(hf: dict[str, Any], arch: str, problems: list[str]) -> int | None:
    """The attention window some layer of ``hf`` slides (None: every layer sees the whole sequence).

    Mistral slides ``sliding_window`` in every layer; Qwen2 only with ``use_sliding_window``,
    in the layers from ``max_window_layers`` on (or as ``layer_types`` lists).
    """
    window = hf.get("sliding_window")
    if arch == QWEN2 and not hf.get("use_sliding_window", False):
        window = None
    layer_types = hf.get("layer_types")
    if layer_types is not None:
        for kind in sorted(set(layer_types) - {"full_attention", "sliding_attention"}):
            problems.append(f"layer_types holds {kind!r}: ladder's blocks are full_attention only")
        if arch == QWEN2 and "sliding_attention" not in layer_types:
            return None  # Qwen2 slides in its sliding_attention layers only
        return window
    if arch == QWEN2 and window is not None:
        first = hf.get("max_window_layers", 28)
        return window if first < int(hf.get("num_hidden_layers", 0)) else None
    return window


def _neutral_problems(hf: dict[str, Any], arch: str) -> list[str]:
    """Keys that change the math away from ladder's decoder: each with its value and the fix."""
    problems = []
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        problems.append(
            f"hidden_act={act!r}: ladder's MLP is SwiGLU (silu); use a model with hidden_act=silu"
        )
    hidden, heads = hf.get("hidden_size"), hf.get("num_attention_heads")
    head_dim = hf.get("head_dim")
    if (
        head_dim is not None
        and isinstance(hidden, int)
        and isinstance(heads, int)
        and head_dim * heads != hidden
    ):
        problems.append(
            f"head_dim={head_dim}: ladder's heads are hidden_size / num_attention_heads = {hidden}/{heads}; "
            "use a model whose head_dim is that, or null"
        )
    dropout = hf.get("attention_dropout") or 0.0
    if dropout > 0:
        problems.append(f"attention_dropout={dropout}: ladder trains without dropout; set it to 0.0")
    if arch == QWEN2 and hf.get("use_mrope"):
        problems.append("use_mrope=true: multimodal RoPE (Qwen2-VL) is not ladder's; use a text model")
    if arch == LLAMA:
        for key, fix in (
            ("attention_bias", "q, k, v and o biases: ladder has q, k and v only (Qwen2ForCausalLM)"),
            ("mlp_bias", "MLP biases: ladder's MLP has none"),
        ):
            if hf.get(key):
                problems.append(f"{key}={hf[key]!r}: {fix}; use a model with {key}=false")
        tp = hf.get("pretraining_tp") or 1
        if tp != 1:
            problems.append(
                f"pretraining_tp={tp}: transformers then splits each projection into {tp} matmuls; "
                "set it to 1 (the same weights, one matmul)"
            )
    return problems


def model_config_from_hf(
    hf: dict[str, Any], *, name: str, base: ModelConfig | None = None, source: str = "config.json"
) -> ModelConfig:
    """ladder's ModelConfig for Hugging Face config ``hf``: ``base``'s other keys (activation
    checkpointing), named ``name``; a ConfigError names each key, value and fix it cannot take.

    ``model.max_seq_len`` becomes ``max_position_embeddings``, or the sliding window when
    one would slide: up to it, sliding-window attention is causal attention, so the model
    ladder trains is the same as transformers' for every sequence it can feed.
    """
    base = base if base is not None else ModelConfig(name=name)
    arch = architecture(hf, source=source)
    problems = [
        f"{key}: missing; add it (every config.json of {arch} has it)" for key in REQUIRED if key not in hf
    ]
    problems += [
        f"{key}={hf[key]!r}: not a key ladder knows for {arch}; it may change the model, so it is "
        "refused: remove it if it does not"
        for key in sorted(set(hf) - INERT - MAPPED)
    ]
    problems += _neutral_problems(hf, arch)
    rope = _rope(hf, problems)
    window = sliding_window(hf, arch, problems)
    if problems:
        raise ConfigError("\n".join(f"  - {source}: {p}" for p in problems))
    positions = int(_get(hf, arch, "max_position_embeddings"))
    n_kv = _get(hf, arch, "num_key_value_heads")
    return dataclasses.replace(
        base,
        name=name,
        n_layer=int(hf["num_hidden_layers"]),
        n_head=int(hf["num_attention_heads"]),
        n_kv_head=None if n_kv is None else int(n_kv),
        d_model=int(hf["hidden_size"]),
        ffn_hidden=int(hf["intermediate_size"]),
        vocab_size=int(hf["vocab_size"]),
        max_seq_len=positions if window is None else min(positions, int(window)),
        tie_embeddings=bool(_get(hf, arch, "tie_word_embeddings")),
        norm_eps=float(_get(hf, arch, "rms_norm_eps")),
        init_std=float(_get(hf, arch, "initializer_range")),
        qkv_bias=arch == QWEN2,
        **rope,
    )


def hf_config_from_model(cfg: ModelConfig, *, dtype: str = "float32") -> JsonObject:
    """The ``config.json`` transformers loads as this model: Qwen2ForCausalLM with ``qkv_bias``,
    LlamaForCausalLM otherwise; ``dtype`` the weights' (torch_dtype). Legacy RoPE keys
    (``rope_theta``, ``rope_scaling``), which transformers 4 and 5 both read."""
    arch = QWEN2 if cfg.qkv_bias else LLAMA
    out: JsonObject = {
        "architectures": [arch],
        "model_type": MODEL_TYPES[arch],
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": n_kv_head(cfg),
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu",
        "initializer_range": cfg.init_std,
        "attention_dropout": 0.0,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "torch_dtype": dtype,
    }
    if cfg.rope_scaling == RopeScaling.llama3:
        out["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": cfg.rope_scaling_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_seq_len,
        }
    if arch == LLAMA:
        out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1, head_dim=cfg.d_model // cfg.n_head)
    else:
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layer)
    return out


def resolve_hf_model(model: ModelConfig) -> ModelConfig:
    """``model`` with the shape its ``hf_config`` file gives (itself when it names none).

    A model.* key the file sets, given on the command line too with another value, is refused:
    the file is the model. ``max_seq_len`` and ``init_std`` set by hand stay (a shorter context
    is the same model; the initial scale is not its shape); a ``max_seq_len`` past the file's
    own limit is refused.
    """
    if model.hf_config is None:
        return model
    source = f"model.hf_config={model.hf_config}"
    resolved = model_config_from_hf(
        read_hf_config(model.hf_config), name=model.name, base=model, source=source
    )
    schema = ModelConfig()
    problems = [
        f"model.{key}={getattr(model, key)!r} is set, but {source} sets it to {getattr(resolved, key)!r} "
        f"(from {SETS[key]}); drop model.{key} or edit the file"
        for key in SETS
        if getattr(model, key) != getattr(schema, key) and getattr(model, key) != getattr(resolved, key)
    ]
    # Set by hand, these two stay; unset, the file's.
    init_std = model.init_std if model.init_std != schema.init_std else resolved.init_std
    max_seq_len = resolved.max_seq_len
    if model.max_seq_len != schema.max_seq_len:
        if model.max_seq_len > resolved.max_seq_len:
            problems.append(
                f"model.max_seq_len={model.max_seq_len} exceeds the {resolved.max_seq_len} positions of "
                f"{source} (max_position_embeddings, or the sliding window past which attention would "
                f"differ); use model.max_seq_len <= {resolved.max_seq_len}"
            )
        max_seq_len = model.max_seq_len
    if problems:
        raise ConfigError("\n".join(f"  - {p}" for p in problems))
    return dataclasses.replace(resolved, init_std=init_std, max_seq_len=max_seq_len)


__all__ = [
    "SUPPORTED",
    "architecture",
    "hf_config_from_model",
    "model_config_from_hf",
    "read_hf_config",
    "resolve_hf_model",
    "sliding_window",
]
