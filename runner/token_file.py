"""A user's token file (``data.path``): a raw array of token ids, memory-mapped and checked.

numpy only, so the launching process checks the file before any rank starts
(runner.validate) and each rank opens it the same way (runner.data.BatchSource).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TOKEN_DTYPES = ("uint8", "uint16", "uint32")
# Token files up to this many tokens are scanned whole for the largest id at
# start-up (about a second per GB read); larger ones are checked on evenly
# spaced chunks of this total size, and every batch is checked as it is read.
_SCAN_TOKENS = 1 << 28
_SCAN_CHUNK = 1 << 22


def _max_token(tokens: np.ndarray) -> int:
    """Largest token id: the whole array if small, else evenly spaced chunks."""
    n = len(tokens)
    if n <= _SCAN_TOKENS:
        starts = range(0, n, _SCAN_CHUNK)
    else:
        n_chunks = _SCAN_TOKENS // _SCAN_CHUNK
        starts = range(0, n - _SCAN_CHUNK + 1, (n - _SCAN_CHUNK) // (n_chunks - 1))
    return max(int(tokens[s : s + _SCAN_CHUNK].max()) for s in starts)


def open_token_file(path: str, dtype: str, vocab_size: int) -> np.ndarray:
    """Memory-map a raw token file read-only, checking it fits model.vocab_size."""
    if dtype not in TOKEN_DTYPES:
        raise ValueError(
            f"data.dtype={dtype!r} is not one of {', '.join(TOKEN_DTYPES)}; "
            "set it to the dtype the token file was written with"
        )
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(
            f"data.path={path!r} does not exist or is not a file; point it at a "
            f"raw {dtype} token file (e.g. np.array(ids, np.{dtype}).tofile(path)) "
            "or leave data.path unset for the built-in text"
        )
    itemsize = np.dtype(dtype).itemsize
    n_bytes = file.stat().st_size
    if n_bytes == 0 or n_bytes % itemsize != 0:
        raise ValueError(
            f"data.path={path!r} holds {n_bytes} bytes, which is not a positive "
            f"multiple of {itemsize} (data.dtype={dtype!r}); check data.dtype"
        )
    tokens = np.memmap(file, dtype=dtype, mode="r")
    max_id = _max_token(tokens)
    if max_id >= vocab_size:
        raise ValueError(
            f"data.path={path!r} holds token id {max_id} >= model.vocab_size="
            f"{vocab_size}; set model.vocab_size > {max_id} (the tokenizer's "
            f"vocabulary size) or check data.dtype={dtype!r}"
        )
    return tokens


def token_file_problem(path: str, dtype: str, vocab_size: int, seq_len: int) -> str | None:
    """What is wrong with ``path`` as this run's tokens, said with the key and the fix; None if nothing."""
    try:
        tokens = open_token_file(path, dtype, vocab_size)
    except ValueError as error:
        return str(error)
    if len(tokens) < seq_len + 1:
        return (
            f"data.path={path!r} holds {len(tokens)} tokens of {dtype}, fewer than data.seq_len + 1 = "
            f"{seq_len + 1}; lower data.seq_len or give more data"
        )
    return None


__all__ = ["TOKEN_DTYPES", "open_token_file", "token_file_problem"]
