"""The attention's head layout: heads that split d_model whole, an even head size, kv heads that group them.

runner/model/transformer.py's attention (Meta's Llama layout): n_head query heads of
d_model / n_head channels each, RoPE on each head, and n_kv_head key/value heads each
serving n_head / n_kv_head query heads (grouped-query attention, Ainslie et al. 2023,
arXiv 2305.13245).
"""

from __future__ import annotations


def head_problems(*, d_model: int, n_head: int, n_kv_head: int | None) -> list[str]:
    """Why this head layout cannot be built (empty when it can); ``n_kv_head=None``: as many as n_head."""
    problems = []
    if d_model % n_head:
        problems.append(
            f"model.d_model={d_model} is not divisible by model.n_head={n_head}; "
            f"pick n_head among the divisors of d_model"
        )
    elif (d_model // n_head) % 2:
        # RoPE rotates pairs of channels (runner/model/transformer.py apply_rotary_emb).
        problems.append(
            f"model.d_model={d_model} / model.n_head={n_head} = {d_model // n_head}: an odd head size; "
            f"RoPE rotates pairs of channels, so pick n_head for an even d_model / n_head"
        )
    kv = n_head if n_kv_head is None else n_kv_head
    if kv < 1 or n_head % kv:
        problems.append(
            f"model.n_kv_head={n_kv_head} must divide model.n_head={n_head} (grouped-query attention)"
        )
    return problems


__all__ = ["head_problems"]
