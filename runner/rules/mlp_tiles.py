"""How many pieces each block's MLP runs in, and which runs take pieces.

A block's SwiGLU MLP holds four (micro, seq, ffn_hidden) tensors for backward: at 128K tokens
and Llama 3.1 8B's 14,336-wide MLP, 14.7 GB a layer in bf16. With ``model.mlp_tiles`` above 1,
runner/model/transformer.py's ``FeedForward`` runs through DeepSpeed's ``TiledMLP`` (ALST, arXiv
2506.13996; deepspeed/runtime/sequence_parallel/ulysses_sp.py): forward over pieces of the
sequence without keeping anything but the MLP's input, and in backward each piece's forward
again, then its backward. The ffn-wide tensors exist for one piece at a time.
"""

from __future__ import annotations

from runner.config import ModelConfig


def mlp_tile_count(model: ModelConfig, *, tokens: int) -> int:
    """Pieces the MLP runs in over a micro-batch of ``tokens`` (micro x seq) tokens (1: whole).

    TiledMLP's backward cuts the flattened tokens with ``torch.chunk(x, shards)``, which makes
    pieces of ceil(tokens / shards) and so fewer than ``shards`` when that does not come out (6 in
    4: three pieces of 2); and it marks a parameter's gradient ready for ZeRO's reduction only at
    piece ``shards - 1``. So the count handed to it is the number of pieces torch.chunk makes.
    """
    asked = min(model.mlp_tiles, tokens)
    piece = -(-tokens // asked)
    return -(-tokens // piece)


def mlp_tile_problems(model: ModelConfig, *, seq_len: int, compiled: bool) -> list[str]:
    """Why ``model.mlp_tiles`` cannot be taken by this run (empty when it can)."""
    tiles = model.mlp_tiles
    if tiles == 1:
        return []
    problems = []  # below 1 the schema's range refuses (runner/config.py ModelConfig.mlp_tiles)
    if tiles > seq_len:
        problems.append(
            f"model.mlp_tiles={tiles} > data.seq_len={seq_len}: every piece needs a token; "
            f"set model.mlp_tiles to at most {seq_len}, or 1 (whole)"
        )
    if compiled:
        problems.append(mlp_tile_compile_problem(tiles))
    return problems


def mlp_tile_compile_problem(tiles: int) -> str:
    """The refusal of the MLP in pieces inside a compiled block."""
    return (
        f"model.mlp_tiles={tiles} with train.compile=true: TiledMLP is an autograd.Function that "
        "calls the MLP module piece by piece, which a compiled block does not trace as one graph; "
        "set model.mlp_tiles=1 or train.compile=false"
    )


__all__ = ["mlp_tile_compile_problem", "mlp_tile_count", "mlp_tile_problems"]
