"""The documents of ``ladder tokenize``'s inputs, read in order and handed on in chunks.

- plain text (``.txt``, and any suffix not below): the whole file is one document, or with
  ``--split line`` each line, with ``--split blank`` each run of lines between blank lines;
- JSON Lines (``.jsonl``, ``.json``): one object a line, the document in its field ``--field``;
- Parquet (``.parquet``): the column ``--column``, read with pyarrow (the ``hf`` extra).

Files are UTF-8. Empty documents (and null values) are skipped: they would add an end-of-text
token alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

TxtSplit = Literal["file", "line", "blank"]
TXT_SPLITS: tuple[TxtSplit, ...] = ("file", "line", "blank")
_KINDS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_PARQUET_BATCH_ROWS = 1024
PYARROW_EXTRA = "pip install 'ladder[hf]' (or: pip install pyarrow)"


class DocumentError(ValueError):
    """An input that cannot be read as documents, said with the file, the place and the fix."""


@dataclass(frozen=True)
class DocumentOptions:
    """How the inputs hold their documents: the text split, the JSON field, the Parquet column."""

    split: TxtSplit = "file"
    field: str = "text"
    column: str = "text"


@dataclass
class Chunk:
    """Consecutive documents, and the input bytes they came from (for the progress)."""

    documents: list[str] = field(default_factory=list)
    bytes_in: int = 0
    chars: int = 0


def _kind(path: Path) -> str:
    """jsonl or parquet, from the file's suffix; text for every other."""
    return _KINDS.get(path.suffix.lower(), "text")


def _parquet_column_problem(path: Path, column: str) -> str | None:
    """What keeps ``column`` of the Parquet file from being read as text, or None."""
    try:
        import pyarrow as pa  # deferred: only Parquet inputs need it (the hf extra)
        import pyarrow.parquet as pq
    except ImportError:
        return f"input {path} is Parquet, which needs the pyarrow package: {PYARROW_EXTRA}"
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as error:
        return f"input {path} is not a readable Parquet file ({error})"
    if column not in schema.names:
        names = ", ".join(schema.names)
        return f"input {path} has no column --column={column!r} (it has: {names}); pass --column NAME"
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        return f"input {path}'s column --column={column!r} holds {kind}, not text; pass the text column"
    return None


def input_problems(paths: Sequence[Path], options: DocumentOptions) -> list[str]:
    """What keeps each input from being read (missing, a Parquet file without the column), each
    with the fix; checked before anything is written."""
    problems = []
    for path in paths:
        if not path.is_file():
            problems.append(
                f"input {path}: no such file; give existing text (.txt), JSON Lines (.jsonl, .json) "
                f"or Parquet (.parquet) files"
            )
        elif _kind(path) == "parquet":
            problem = _parquet_column_problem(path, options.column)
            if problem is not None:
                problems.append(problem)
    return problems


def _decoded(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8, or a DocumentError naming ``where``."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DocumentError(
            f"{where} is not UTF-8 (byte {error.start}: {error.reason}); convert the file to UTF-8"
        ) from error


def _text_documents(path: Path, split: TxtSplit) -> Iterator[tuple[str, int]]:
    """A .txt file's documents, each with the bytes it took."""
    if split == "file":
        raw = path.read_bytes()
        yield _decoded(raw, f"input {path}"), len(raw)
        return
    paragraph: list[str] = []
    held = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = _decoded(raw, f"input {path}:{number}")
            held += len(raw)
            if split == "line":
                yield line.rstrip("\r\n"), held
                held = 0
            elif line.strip():
                paragraph.append(line)
            elif paragraph:
                yield "".join(paragraph).rstrip("\r\n"), held
                paragraph, held = [], 0
    if paragraph or held:
        yield "".join(paragraph).rstrip("\r\n"), held


def _jsonl_documents(path: Path, field_name: str) -> Iterator[tuple[str, int]]:
    """A JSON Lines file's documents (field ``field_name`` of each object), each with its bytes."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"input {path}:{number}"
            if not raw.strip():
                yield "", len(raw)
                continue
            try:
                record = json.loads(raw)
            except ValueError as error:
                raise DocumentError(
                    f"{where} is not JSON ({error}); each line of a JSON Lines file is one object"
                ) from error
            if not isinstance(record, dict) or field_name not in record:
                fields = ", ".join(record) if isinstance(record, dict) else f"a {type(record).__name__}"
                raise DocumentError(
                    f"{where} has no field --field={field_name!r} (it has: {fields}); "
                    f"pass --field NAME, the field that holds the text"
                )
            text = record[field_name]
            if text is not None and not isinstance(text, str):
                raise DocumentError(
                    f"{where}: field --field={field_name!r} holds a {type(text).__name__}, not text; "
                    f"pass --field NAME, the field that holds the text"
                )
            yield text or "", len(raw)


def _parquet_documents(path: Path, column: str) -> Iterator[tuple[str, int]]:
    """A Parquet file's documents (column ``column``), each with its share of the file's bytes."""
    import pyarrow.parquet as pq  # deferred: only Parquet inputs need it (the hf extra)

    parquet = pq.ParquetFile(path)
    rows, size = max(parquet.metadata.num_rows, 1), path.stat().st_size
    seen = 0
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=[column]):
        for text in batch.column(0).to_pylist():
            seen += 1
            # Bytes counted by rows read: the file's size at the last row.
            yield text or "", size * seen // rows - size * (seen - 1) // rows


def documents(path: Path, options: DocumentOptions) -> Iterator[tuple[str, int]]:
    """One input's documents in order, each with the input bytes it took (empty ones included)."""
    kind = _kind(path)
    if kind == "text":
        return _text_documents(path, options.split)
    if kind == "jsonl":
        return _jsonl_documents(path, options.field)
    return _parquet_documents(path, options.column)


def chunks(
    paths: Sequence[Path], options: DocumentOptions, *, chunk_chars: int, chunk_documents: int
) -> Iterator[Chunk]:
    """The inputs' non-empty documents in order, in chunks of about ``chunk_chars`` characters or
    ``chunk_documents`` documents, whichever comes first."""
    chunk = Chunk()
    for path in paths:
        for text, taken in documents(path, options):
            chunk.bytes_in += taken
            if text:
                chunk.documents.append(text)
                chunk.chars += len(text)
            if chunk.chars >= chunk_chars or len(chunk.documents) >= chunk_documents:
                yield chunk
                chunk = Chunk()
    if chunk.documents or chunk.bytes_in:
        yield chunk


__all__ = [
    "TXT_SPLITS",
    "Chunk",
    "DocumentError",
    "DocumentOptions",
    "TxtSplit",
    "chunks",
    "documents",
    "input_problems",
]
