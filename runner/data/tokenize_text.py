"""``ladder tokenize``: documents to one llm.c token shard, the format ``data.path`` reads.

Each document is encoded without the tokenizer's own special tokens (no BOS) and followed by
the end-of-text token, so the file is ``doc1 EOS doc2 EOS ...`` (nanoGPT's
``data/openwebtext/prepare.py`` ``process``). Token ids are uint16 when the vocabulary fits
(GPT-2's llm.c format), else uint32 (Llama 3's); the header says which, so ``data.dtype`` need
not. Chunks of documents are encoded by worker processes and written in input order.

The shard is written to a temporary file beside ``--out``, synced, then renamed over it: a
run that fails or is interrupted leaves no file and the earlier one, if any, as it was.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from runner.data.text_documents import Chunk, DocumentOptions, chunks
from runner.data.token_file import LLMC_COUNT_MAX, LLMC_HEADER_INT32, llmc_header
from runner.data.tokenizer_dir import eos_id, load_tokenizer, tokenizer_sha256, vocab_size

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_KEY = "--tokenizer"
# A chunk handed to a worker: this many characters or documents, whichever comes first. Large
# enough that passing it costs little beside encoding it, small enough that the progress moves,
# memory stays flat and a corpus of short documents still spreads over the workers.
CHUNK_CHARS = 1 << 20
CHUNK_DOCUMENTS = 1024
UINT16_VOCAB = 1 << 16

# (bytes in, documents, tokens) of the chunk just written.
ProgressCallback = Callable[[int, int, int], None]


@dataclass(frozen=True)
class TokenizeResult:
    """What a tokenize run wrote: the file, its counts, its dtype and how long it took."""

    out: Path
    tokens: int
    documents: int
    bytes_in: int
    bytes_out: int
    seconds: float
    dtype: str
    vocab_size: int
    eos: str
    tokenizer_sha256: str

    @property
    def tokens_per_s(self) -> float:
        """Tokens written per second of wall time."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def token_dtype(vocab: int) -> str:
    """uint16 where every id fits (vocab <= 65536), else uint32: the llm.c formats data.path reads."""
    return "uint16" if vocab <= UINT16_VOCAB else "uint32"


# One worker's tokenizer, loaded once per process (_start_worker).
_WORKER: tuple[Tokenizer, int, str] | None = None


def _start_worker(directory: str, eos: int, dtype: str) -> None:
    """Load the tokenizer in this process; its own threads off (the processes are the parallelism)."""
    global _WORKER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = (load_tokenizer(directory, key=TOKENIZER_KEY), eos, dtype)


def _encode(documents: list[str]) -> np.ndarray:
    """The chunk's documents as token ids, each followed by the end-of-text id."""
    assert _WORKER is not None, "_start_worker runs first"
    tokenizer, eos, dtype = _WORKER
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(documents, add_special_tokens=False):
        ids += encoding.ids
        ids.append(eos)
    return np.array(ids, dtype=dtype)


@contextlib.contextmanager
def atomic_output(out: Path) -> Iterator[BinaryIO]:
    """A temporary file beside ``out`` to write; on success synced and renamed to ``out``, on any
    failure (an interrupt included) removed."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename itself is durable once the directory is synced.
    directory = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _encoded_in_order(
    source: Iterator[Chunk], workers: int, init: tuple[str, int, str]
) -> Iterator[tuple[Chunk, np.ndarray]]:
    """Each chunk with its ids, in input order; ``workers`` processes, at most two chunks each in
    flight (Pool.imap would read the whole input ahead)."""
    if workers == 1:
        _start_worker(*init)
        for chunk in source:
            yield chunk, _encode(chunk.documents)
        return
    # spawn: a fresh interpreter, not a fork of one that may hold threads.
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_start_worker, initargs=init) as pool:
        pending: deque[tuple[Chunk, AsyncResult[np.ndarray]]] = deque()
        for chunk in source:
            pending.append((chunk, pool.apply_async(_encode, (chunk.documents,))))
            if len(pending) >= 2 * workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()


def tokenize_to_file(
    inputs: Sequence[Path],
    out: Path,
    tokenizer_dir: Path,
    *,
    options: DocumentOptions,
    eos: str | None = None,
    workers: int = 1,
    progress: ProgressCallback | None = None,
) -> TokenizeResult:
    """Tokenize ``inputs`` with the tokenizer in ``tokenizer_dir`` into the llm.c shard ``out``."""
    start = time.perf_counter()
    tokenizer = load_tokenizer(tokenizer_dir, key=TOKENIZER_KEY)
    eos_token, eos_index = eos_id(tokenizer, tokenizer_dir, eos, key=TOKENIZER_KEY)
    vocab = vocab_size(tokenizer)
    dtype, sha256 = token_dtype(vocab), tokenizer_sha256(tokenizer_dir)
    tokens = documents = bytes_in = 0
    source = chunks(inputs, options, chunk_chars=CHUNK_CHARS, chunk_documents=CHUNK_DOCUMENTS)
    with atomic_output(out) as handle:
        handle.write(bytes(LLMC_HEADER_INT32 * 4))  # the count is known at the end
        for chunk, ids in _encoded_in_order(source, workers, (str(tokenizer_dir), eos_index, dtype)):
            tokens += len(ids)
            if tokens > LLMC_COUNT_MAX:
                raise ValueError(
                    f"the inputs hold more than {LLMC_COUNT_MAX:,} tokens, the most one llm.c shard "
                    f"counts; tokenize them in parts to several --out files (data.path takes a glob)"
                )
            handle.write(ids.tobytes())
            documents += len(chunk.documents)
            bytes_in += chunk.bytes_in
            if progress is not None:
                progress(chunk.bytes_in, len(chunk.documents), len(ids))
        handle.seek(0)
        handle.write(llmc_header(dtype, tokens, sha256, eos_index))
    return TokenizeResult(
        out=out,
        tokens=tokens,
        documents=documents,
        bytes_in=bytes_in,
        bytes_out=out.stat().st_size,
        seconds=time.perf_counter() - start,
        dtype=dtype,
        vocab_size=vocab,
        eos=eos_token,
        tokenizer_sha256=sha256,
    )


__all__ = ["TokenizeResult", "atomic_output", "token_dtype", "tokenize_to_file"]
