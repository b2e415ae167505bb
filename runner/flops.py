"""Analytic training FLOPs per token, and utilisation against a peak (MFU, HFU).

Formula: 6N + 12*L*h*s FLOPs per token for forward + backward (PaLM, Chowdhery et al. 2022,
arXiv 2204.02311, appendix B; the same count as nanoGPT's ``estimate_mfu``, torchtitan's
``get_num_flop_per_token`` and llm-foundry). 6N: each parameter does one multiply-add (2
FLOPs) per token in the forward pass and two in the backward (gradients w.r.t. input and
weight). 12*L*h*s: the attention scores QK^T and the weighted sum over V, 2*s*h FLOPs each
per token and layer in the forward, times 3 for forward + backward. These matmuls have no
parameters, so 6N misses them.

What N is: the parameters that do a matmul per token. The input embedding is a table
lookup (no FLOPs), so an untied input embedding is left out; the output projection is a
real (h x V) matmul and stays in, tied or not. See :func:`non_embedding_params`.
Norm gains remain in N (a few FLOPs per element, negligible: 6 * (2L + 1) * h).
"""

from __future__ import annotations

from typing import Any

from runner.config import Recompute


def non_embedding_params(num_params: int, *, vocab_size: int, d_model: int, tie_embeddings: bool) -> int:
    """Parameters that do matmul work per token: all but an untied input-embedding table.

    Conventions differ among users of 6N: nanoGPT's ``estimate_mfu`` takes all parameters
    except position embeddings (its tied token table counts once, as the lm head);
    torchtitan subtracts every ``nn.Embedding`` parameter, which for a tied model also
    drops the output head's V*h matmul. Here: an untied input table (V*h) is subtracted; a
    tied one is the output head's weight and stays, since that matmul costs 2*V*h FLOPs
    per token in the forward.
    """
    if tie_embeddings:
        return num_params
    embedding = vocab_size * d_model
    if embedding > num_params:
        raise ValueError(f"vocab_size*d_model={embedding} exceeds num_params={num_params}")
    return num_params - embedding


def _attention_flops_per_token(*, n_layers: int, d_model: int, seq_len: int, causal: bool) -> float:
    """Forward + backward FLOPs per token of QK^T and AV: 12*L*h*s, halved if causal."""
    # PaLM appendix B: 12LHQT with H*Q = h (heads x head size) and T = s. With a causal mask
    # only the lower triangle is needed: Megatron-LM's num_floating_point_operations
    # (megatron/training/training.py) divides this term by 2 ("Only half of the attention
    # matrix is non-zero"); the formula of Narayanan et al. 2021 (arXiv 2104.04473), which
    # that code extends, counts the full square like PaLM.
    term = 12.0 * n_layers * d_model * seq_len
    return term / 2 if causal else term


def flops_per_token(
    *, num_params: int, n_layers: int, d_model: int, seq_len: int, causal: bool = False
) -> float:
    """Model FLOPs per token for one forward + backward: 6N + 12*L*h*s (PaLM appendix B).

    ``num_params`` is N as described in the module docstring (use
    :func:`non_embedding_params` for an untied model). ``causal=True`` halves the attention
    term (Megatron-LM's code convention for causal masks); the default is PaLM's full count.
    A causal kernel really computes (s + 1)/2 keys per query on average, so the halved
    figure is the closer count of work done; the full one is the comparable, published MFU.
    """
    if min(num_params, n_layers, d_model, seq_len) < 0:
        raise ValueError("num_params, n_layers, d_model and seq_len must be >= 0")
    # 6N: 2N forward (one multiply-add per parameter) + 4N backward (input and weight grads).
    return 6.0 * num_params + _attention_flops_per_token(
        n_layers=n_layers, d_model=d_model, seq_len=seq_len, causal=causal
    )


def recompute_flops_per_token(  # noqa: PLR0913 - one keyword per shape figure the count needs
    *,
    num_params: int,
    n_layers: int,
    d_model: int,
    seq_len: int,
    recompute: Recompute | str,
    causal: bool = False,
    kv_width: int | None = None,
    ffn_hidden: int | None = None,
) -> float:
    """Extra forward FLOPs per token that activation checkpointing redoes in backward (for HFU).

    The forward is one third of 6N + 12*L*h*s: 2N + 4*L*h*s. Full recompute (each block
    under checkpoint) re-runs the forward once more: 2N + 4Lhs, an upper bound by the output
    head's 2*V*h, which model.py does not recompute (pass the block parameters as N for the
    exact figure). The attention mode re-runs only the attention core (Korthikanti et al.
    2022, arXiv 2205.05198, Sec. 5): its score and value matmuls, 4*L*h*s (RoPE and the
    softmax are elementwise, not counted, like the softmax in 12Lhs). Op-level selective
    (runner/model/op_recompute.py) re-runs wk, wo and w3 of each block: 2*L*(h*kv + h*h + h*f),
    with ``kv_width`` (n_kv_head x head size) and ``ffn_hidden`` given. ``causal`` halves the
    attention part as in :func:`flops_per_token`.
    """
    value = getattr(recompute, "value", recompute)  # the member (runner.config.Recompute) or its value
    if value not in {mode.value for mode in Recompute}:
        raise ValueError(f"recompute={value!r} is not one of {', '.join(mode.value for mode in Recompute)}")
    attention_forward = (
        _attention_flops_per_token(n_layers=n_layers, d_model=d_model, seq_len=seq_len, causal=causal) / 3.0
    )
    mode = Recompute(value)
    if mode == Recompute.none:
        return 0.0
    if mode == Recompute.attention:
        return attention_forward
    if mode == Recompute.selective:
        if kv_width is None or ffn_hidden is None:
            raise ValueError("selective recompute's FLOPs need kv_width and ffn_hidden")
        return 2.0 * n_layers * d_model * (kv_width + d_model + ffn_hidden)
    return 2.0 * num_params + attention_forward


def _check_rate(**values: Any) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name}={value} must be > 0")


def mfu(
    *, tokens_per_s: float, flops_per_token: float, peak_flops_per_device: float, n_devices: int
) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s / (peak FLOP/s per device x devices).

    PaLM (arXiv 2204.02311) appendix B: tokens/s x model FLOPs per token over the aggregate
    peak. ``tokens_per_s`` is the whole job's throughput over all ``n_devices``.
    """
    _check_rate(peak_flops_per_device=peak_flops_per_device, n_devices=n_devices)
    return tokens_per_s * flops_per_token / (peak_flops_per_device * n_devices)


def hfu(
    *,
    tokens_per_s: float,
    flops_per_token: float,
    recompute_flops_per_token: float,
    peak_flops_per_device: float,
    n_devices: int,
) -> float:
    """Hardware FLOPs utilisation: like mfu, counting recomputed forward work too (PaLM appendix B)."""
    return mfu(
        tokens_per_s=tokens_per_s,
        flops_per_token=flops_per_token + recompute_flops_per_token,
        peak_flops_per_device=peak_flops_per_device,
        n_devices=n_devices,
    )


__all__ = [
    "flops_per_token",
    "hfu",
    "mfu",
    "non_embedding_params",
    "recompute_flops_per_token",
]
