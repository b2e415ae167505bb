"""The model's shape by arithmetic: its parameter count and the checks on its head layout.

Kept apart from runner/model/transformer.py so the launching process can count and check a model
without importing torch (a refused run answers in about a second).
"""

from __future__ import annotations

from runner.config import ModelConfig
from runner.errors import ConfigError
from runner.rules import head_problems


def n_kv_head(cfg: ModelConfig) -> int:
    """Key/value head count: `n_kv_head`, or `n_head` when unset (no GQA)."""
    return cfg.n_head if cfg.n_kv_head is None else cfg.n_kv_head


def check_shape(cfg: ModelConfig) -> None:
    """Reject shapes the attention layout cannot represent, naming the fix (runner.rules.head_problems)."""
    problems = head_problems(d_model=cfg.d_model, n_head=cfg.n_head, n_kv_head=cfg.n_kv_head)
    if problems:
        raise ConfigError("\n".join(f"  - {p}" for p in problems))


def num_params(cfg: ModelConfig) -> int:
    """Exact parameter count of `build_model(cfg)`, by arithmetic (no allocation)."""
    check_shape(cfg)
    C, V, F_ = cfg.d_model, cfg.vocab_size, cfg.ffn_hidden
    kv_dim = n_kv_head(cfg) * (C // cfg.n_head)
    attention = C * C + 2 * C * kv_dim + C * C  # wq, wk, wv, wo
    if cfg.qkv_bias:
        attention += C + 2 * kv_dim  # wq, wk, wv's biases
    feed_forward = 3 * C * F_  # w1, w2, w3
    norms = 2 * C  # attention_norm, ffn_norm
    per_layer = attention + feed_forward + norms
    embedding = V * C
    output = 0 if cfg.tie_embeddings else V * C  # a tied output adds no parameters
    return embedding + cfg.n_layer * per_layer + C + output  # + C: final norm


def layer_param_numels(model: ModelConfig, tp: int = 1) -> list[int]:
    """Numel of each parameter tensor of one transformer block a rank holds, in module order:
    attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3 (with ``qkv_bias``, each of wq, wk
    and wv followed by its bias).

    With ``tp`` > 1 the attention and MLP matrices hold 1/tp each, the column-parallel
    biases with them, and the norm gains stay whole (the partition of runner/parallel/tensor.py).
    """
    h, f = model.d_model, model.ffn_hidden
    kv_width = n_kv_head(model) * (h // model.n_head)
    q, kv, ffn = h * h // tp, h * kv_width // tp, h * f // tp  # one rank's shard of each matrix
    if model.qkv_bias:
        q_bias, kv_bias = h // tp, kv_width // tp
        return [h, q, q_bias, kv, kv_bias, kv, kv_bias, q, h, ffn, ffn, ffn]
    return [h, q, kv, kv, q, h, ffn, ffn, ffn]


def vocab_rows(model: ModelConfig, tp: int = 1) -> int:
    """Vocabulary rows of the output head the fullest tensor-parallel rank holds: ceil(V / tp).

    AutoTP splits the head by vocabulary as evenly as it can, the first V mod tp ranks one
    row more (DeepSpeed 0.19.8 module_inject/tp_shard.py ``get_shard_size``, grain 1).
    """
    return -(-model.vocab_size // tp)


def embedding_numels(model: ModelConfig, tp: int = 1) -> tuple[int, int]:
    """Numel of the token embedding and of the output head one rank holds.

    Under ``tp`` both are split by vocabulary (runner/parallel/tensor.py); tied, they are
    one weight, which ``param_numels`` counts once.
    """
    rows = vocab_rows(model, tp) * model.d_model
    return rows, rows


def param_numels(model: ModelConfig, tp: int = 1) -> list[int]:
    """Numel of every parameter tensor of runner/model/transformer.py's Transformer one rank holds, in module
    order
    (the order DeepSpeed flattens them in): the embedding, the blocks, the final norm and,
    untied, the output head (split by vocabulary under ``tp``; the norm gains stay whole).
    """
    lookup, head = embedding_numels(model, tp)
    numels = [lookup, *layer_param_numels(model, tp) * model.n_layer, model.d_model]
    if not model.tie_embeddings:
        numels.append(head)
    return numels
