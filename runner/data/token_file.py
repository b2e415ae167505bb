"""A user's token files (``data.path``): memory-mapped arrays of token ids, checked before launch.

``data.path`` names one file or, with a glob (``/data/fineweb_train_*.bin``), the shards of
one corpus, read as their concatenation in sorted order. Each file is one of:

- a raw array of ``data.dtype`` ids (``np.array(ids, np.uint16).tofile(path)``; nanoGPT's
  ``train.bin``);
- a NumPy ``.npy`` file (``np.save``), recognised by its magic string: its header gives the
  dtype (any integer dtype) and it must be one-dimensional;
- a shard in llm.c's format (karpathy/llm.c ``dev/data/data_common.py`` ``write_datafile``,
  also modded-nanogpt's FineWeb shards): a header of 256 int32 (magic, version, token count),
  then the tokens, uint16 for magic 20240520 version 1 (GPT-2), uint32 for 20240801
  version 7 (Llama 3). Recognised only where the file's size is exactly the header's count.
  ``ladder tokenize`` writes this format (``llmc_header``), and in the header's unused ints the
  sha256 of the tokenizer that wrote it (``llmc_tokenizer_sha256``) and the id of the token that
  ends each document (``llmc_eos_id``).

numpy only, so the launching process checks the files before any rank starts
(runner.preflight.validate) and each rank opens them the same way (runner.data.batches.BatchSource).
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

import numpy as np

TOKEN_DTYPES = ("uint8", "uint16", "uint32")
# Token files up to this many tokens are scanned whole for the largest id at
# start-up (about a second per GB read); larger ones are checked on evenly
# spaced chunks of this total size, and every batch is checked as it is read.
_SCAN_TOKENS = 1 << 28
_SCAN_CHUNK = 1 << 22
NPY_MAGIC = b"\x93NUMPY"
LLMC_HEADER_INT32 = 256
LLMC_FORMATS = {(20240520, 1): "uint16", (20240801, 7): "uint32"}  # (magic, version) -> token dtype
# llm.c reads header[0:3] and writes zeros after them; ladder tokenize puts this mark in
# header[3] and the tokenizer's sha256 (runner.data.tokenizer_dir.tokenizer_sha256) in header[4:12].
LLMC_TOKENIZER_MARK = 0x4C444452  # "LDDR"
# ... and this mark in header[12] with the id of the token that ends each document in header[13]
# (``ladder tokenize --eos``, or the tokenizer's own eos_token): an export names it even where
# the tokenizer's files do not.
LLMC_EOS_MARK = 0x454F5321  # "EOS!"
LLMC_COUNT_MAX = 2**31 - 1  # the header's count is an int32


class TokenShards:
    """Several token arrays read as one: ``len`` and slices across shard boundaries."""

    def __init__(self, shards: Sequence[np.ndarray]) -> None:
        self.shards = list(shards)
        self.starts = np.cumsum([0, *(len(shard) for shard in self.shards)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop = key.start or 0, min(key.stop if key.stop is not None else len(self), len(self))
        index = int(np.searchsorted(self.starts, start, side="right")) - 1
        parts = []
        while start < stop:
            local = start - int(self.starts[index])
            taken = self.shards[index][local : local + stop - start]
            parts.append(taken)
            start += len(taken)
            index += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _id_range(tokens: np.ndarray) -> tuple[int, int]:
    """Smallest and largest token id: the whole array if small, else evenly spaced chunks."""
    n = len(tokens)
    if n <= _SCAN_TOKENS:
        starts = range(0, n, _SCAN_CHUNK)
    else:
        n_chunks = _SCAN_TOKENS // _SCAN_CHUNK
        starts = range(0, n - _SCAN_CHUNK + 1, (n - _SCAN_CHUNK) // (n_chunks - 1))
    chunks = [tokens[s : s + _SCAN_CHUNK] for s in starts]
    return min(int(c.min()) for c in chunks), max(int(c.max()) for c in chunks)


def _llmc_dtype(head: bytes, n_bytes: int) -> str | None:
    """The token dtype of an llm.c shard whose header and size agree, else None."""
    if len(head) < 12:
        return None
    magic, version, count = (int(v) for v in np.frombuffer(head[:12], dtype="<i4"))
    dtype = LLMC_FORMATS.get((magic, version))
    if dtype is None or n_bytes != LLMC_HEADER_INT32 * 4 + count * np.dtype(dtype).itemsize:
        return None
    return dtype


def llmc_header(
    dtype: str, count: int, tokenizer_sha256: str | None = None, eos_id: int | None = None
) -> bytes:
    """The 1024-byte header of an llm.c shard of ``count`` tokens of ``dtype`` (uint16 or uint32),
    as karpathy/llm.c ``dev/data/data_common.py`` ``write_datafile`` writes it."""
    if not 0 <= count <= LLMC_COUNT_MAX:
        raise ValueError(f"an llm.c shard holds 0 to {LLMC_COUNT_MAX:,} tokens, not {count:,}")
    magic, version = next(key for key, kind in LLMC_FORMATS.items() if kind == dtype)
    header = np.zeros(LLMC_HEADER_INT32, dtype="<i4")
    header[0:3] = magic, version, count
    if tokenizer_sha256 is not None:
        header[3] = LLMC_TOKENIZER_MARK
        header[4:12] = np.frombuffer(bytes.fromhex(tokenizer_sha256), dtype="<i4")
    if eos_id is not None:
        header[12:14] = LLMC_EOS_MARK, eos_id
    return header.tobytes()


def llmc_tokenizer_sha256(file: Path) -> str | None:
    """The sha256 of the tokenizer that wrote this llm.c shard (``ladder tokenize``), or None:
    another format, or a shard written elsewhere."""
    with file.open("rb") as handle:
        head = handle.read(LLMC_HEADER_INT32 * 4)
    if len(head) < 48 or _llmc_dtype(head, file.stat().st_size) is None:
        return None
    header = np.frombuffer(head[:48], dtype="<i4")
    return header[4:12].tobytes().hex() if int(header[3]) == LLMC_TOKENIZER_MARK else None


def llmc_eos_id(file: Path) -> int | None:
    """The id of the token that ends each document of this llm.c shard (``ladder tokenize``), or
    None: another format, or a shard that does not say."""
    with file.open("rb") as handle:
        head = handle.read(LLMC_HEADER_INT32 * 4)
    if len(head) < 56 or _llmc_dtype(head, file.stat().st_size) is None:
        return None
    header = np.frombuffer(head[:56], dtype="<i4")
    return int(header[13]) if int(header[12]) == LLMC_EOS_MARK else None


def _open_one(file: Path, dtype: str, shown: str, key: str = "data.path") -> tuple[np.ndarray, str]:
    """One file's tokens, memory-mapped, and its format in words (``key``: the config key named)."""
    n_bytes = file.stat().st_size
    with file.open("rb") as handle:
        head = handle.read(12)
    if head.startswith(NPY_MAGIC):
        array = np.load(file, mmap_mode="r", allow_pickle=False)
        if array.ndim != 1 or array.dtype.kind not in "ui":
            raise ValueError(
                f"{key}={shown!r} is a .npy array of {array.dtype} with shape {array.shape}; "
                "save the token ids as one dimension of an integer dtype (np.save(path, ids))"
            )
        return array, f".npy of {array.dtype}"
    llmc = _llmc_dtype(head, n_bytes)
    if llmc is not None:
        count = (n_bytes - LLMC_HEADER_INT32 * 4) // np.dtype(llmc).itemsize
        tokens = np.memmap(file, dtype=llmc, mode="r", offset=LLMC_HEADER_INT32 * 4, shape=(count,))
        return tokens, f"llm.c shard of {llmc}"
    itemsize = np.dtype(dtype).itemsize
    if n_bytes == 0 or n_bytes % itemsize != 0:
        raise ValueError(
            f"{key}={shown!r} holds {n_bytes} bytes, which is not a positive "
            f"multiple of {itemsize} (data.dtype={dtype!r}); check data.dtype"
        )
    return np.memmap(file, dtype=dtype, mode="r"), f"raw {dtype}"


def token_files(path: str) -> list[Path]:
    """The files ``data.path`` names: itself, or a glob's matches in sorted order."""
    if glob.has_magic(path):
        return [Path(p) for p in sorted(glob.glob(str(Path(path).expanduser())))]
    return [Path(path).expanduser()]


def open_tokens(
    path: str, dtype: str, vocab_size: int, *, key: str = "data.path"
) -> tuple[np.ndarray | TokenShards, str]:
    """Memory-map ``data.path`` (or the ``key`` given, e.g. data.val_path) read-only, every id
    checked against model.vocab_size; and it in words."""
    if dtype not in TOKEN_DTYPES:
        raise ValueError(
            f"data.dtype={dtype!r} is not one of {', '.join(TOKEN_DTYPES)}; "
            "set it to the dtype the token file was written with"
        )
    files = token_files(path)
    if glob.has_magic(path) and not files:
        raise ValueError(f"{key}={path!r} matches no file; check the pattern")
    shards, formats = [], set()
    for file in files:
        shown = path if len(files) == 1 and not glob.has_magic(path) else str(file)
        if not file.is_file():
            raise ValueError(
                f"{key}={shown!r} does not exist or is not a file; point it at a "
                f"raw {dtype} token file (e.g. np.array(ids, np.{dtype}).tofile(path)), a .npy, "
                f"an llm.c shard, or a glob of them; or leave {key} unset for the built-in text"
            )
        tokens, fmt = _open_one(file, dtype, shown, key)
        low, high = _id_range(tokens)
        if high >= vocab_size:
            raise ValueError(
                f"{key}={shown!r} holds token id {high} >= model.vocab_size={vocab_size}; set "
                f"model.vocab_size > {high} (the tokenizer's vocabulary size) or check "
                f"data.dtype={dtype!r} (read as {fmt})"
            )
        if low < 0:
            raise ValueError(
                f"{key}={shown!r} holds token id {low} < 0 (read as {fmt}); token ids are "
                "never negative: check how the file was written"
            )
        shards.append(tokens)
        formats.add(fmt)
    joined: np.ndarray | TokenShards = shards[0] if len(shards) == 1 else TokenShards(shards)
    words = f"{len(joined):,} tokens in {len(shards)} file(s), {', '.join(sorted(formats))}"
    return joined, words


def token_source_words(path: str, dtype: str) -> str:
    """What ``data.path`` holds, e.g. ``"300,000,000 tokens in 3 file(s), llm.c shard of uint16"``
    (opened, not scanned: for the launch's log line, after the checks)."""
    opened = [_open_one(file, dtype, str(file)) for file in token_files(path)]
    count = sum(len(tokens) for tokens, _ in opened)
    return f"{count:,} tokens in {len(opened)} file(s), {', '.join(sorted({fmt for _, fmt in opened}))}"


def open_token_file(
    path: str, dtype: str, vocab_size: int, *, key: str = "data.path"
) -> np.ndarray | TokenShards:
    """The tokens of ``data.path`` (or ``key``; see ``open_tokens``)."""
    return open_tokens(path, dtype, vocab_size, key=key)[0]


def token_file_problem(
    path: str, dtype: str, vocab_size: int, seq_len: int, *, key: str = "data.path"
) -> str | None:
    """What is wrong with ``path`` as this run's tokens (``key``: data.path, or data.val_path),
    said with the key and the fix; None if nothing."""
    try:
        tokens, words = open_tokens(path, dtype, vocab_size, key=key)
    except ValueError as error:
        return str(error)
    if len(tokens) < seq_len + 1:
        return (
            f"{key}={path!r} holds {words}, fewer than data.seq_len + 1 = "
            f"{seq_len + 1}; lower data.seq_len or give more data"
        )
    return None


__all__ = [
    "LLMC_COUNT_MAX",
    "TOKEN_DTYPES",
    "TokenShards",
    "llmc_header",
    "llmc_tokenizer_sha256",
    "open_token_file",
    "open_tokens",
    "token_file_problem",
    "token_source_words",
]
