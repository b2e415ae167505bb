"""How many pieces the output head and the loss run in, and which layouts take pieces.

The logits of a micro-batch are (micro, seq, vocab): at Llama 3's 128,256-token vocabulary
and 32K tokens their fp32 log-probabilities alone are 16.8 GB, more than the 32 blocks keep
under full recompute. runner/model/transformer.py's ``tiled_lm_loss`` runs the head and the
cross-entropy over ``loss_tile_count`` slices of the sequence, each under a checkpoint: a
slice's logits live only while that slice is computed, in forward and again in backward.

Auto (``model.loss_tiles=null``) takes pieces of at most 1 GiB of fp32 logits, as Arctic Long
Sequence Training's trainer sizes its logits shards (ALST, arXiv 2506.13996; ArcticTraining's
SFT trainer: "about 1GB fp32 logits shards"), so a model whose logits are smaller runs whole,
as before.

Tensor parallelism keeps DeepSpeed's vocabulary-parallel loss, which holds 1/tp of the logits
already; the pipeline's last stage runs DeepSpeed's own loss call. Both run whole.
"""

from __future__ import annotations

from runner.config import ModelConfig, Precision

LOSS_TILE_BYTES = 2**30  # fp32 logits per piece under auto


def loss_tile_count(model: ModelConfig, *, micro_size: int, seq_len: int, tp: int = 1, pp: int = 1) -> int:
    """Pieces of the sequence the head and loss run in for one micro-batch (1: whole)."""
    if tp > 1 or pp > 1:
        return 1
    if model.loss_tiles is not None:
        return min(model.loss_tiles, seq_len)
    logits = Precision.fp32.bytes * micro_size * seq_len * model.vocab_size
    return max(1, min(seq_len, -(-logits // LOSS_TILE_BYTES)))


def loss_tile_problems(model: ModelConfig, *, tp: int, pp: int) -> list[str]:
    """Why ``model.loss_tiles`` cannot be taken by this layout (empty when it can)."""
    tiles = model.loss_tiles
    if tiles is None or tiles == 1:
        return []
    problems = []
    if tp > 1:
        problems.append(
            f"model.loss_tiles={tiles} with parallel.tp={tp}: tensor parallelism keeps DeepSpeed's "
            f"vocabulary-parallel loss, which holds 1/{tp} of the logits on each rank; "
            f"set model.loss_tiles=null (auto) or 1"
        )
    if pp > 1:
        problems.append(
            f"model.loss_tiles={tiles} with parallel.pp={pp}: the pipeline's last stage runs "
            f"DeepSpeed's own loss call on whole logits; set model.loss_tiles=null (auto) or 1"
        )
    return problems


def loss_tile_length_problems(model: ModelConfig, *, seq_len: int) -> list[str]:
    """Why ``model.loss_tiles`` cannot split a sequence of ``seq_len`` tokens (empty when it can)."""
    tiles = model.loss_tiles
    if tiles is None or tiles <= seq_len:
        return []
    return [
        f"model.loss_tiles={tiles} > data.seq_len={seq_len}: every piece needs a token; "
        f"set model.loss_tiles to at most {seq_len}, or null (auto)"
    ]


__all__ = ["LOSS_TILE_BYTES", "loss_tile_count", "loss_tile_length_problems", "loss_tile_problems"]
