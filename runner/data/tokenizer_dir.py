"""A Hugging Face tokenizer directory (``data.tokenizer``, ``ladder tokenize --tokenizer``): its
files, their identity, its vocabulary and its end-of-text token.

The tokenizer is read offline from the directory's ``tokenizer.json`` with the ``tokenizers``
library (``Tokenizer.from_file``), imported only where a tokenizer is named (the ``hf`` extra).
Its identity is a sha256 of its files, so a run records which tokenizer its tokens came from
and ``ladder export`` copies the same files (``tokenizer_files``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runner.data.token_file import llmc_eos_id, token_files
from runner.rundir.summary_records import TokenizerRecord

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_JSON = "tokenizer.json"
# The files of a tokenizer, as transformers saves them beside (or without) a model: its
# tokenization_utils_base.py (FULL_TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE,
# ADDED_TOKENS_FILE), the models' VOCAB_FILES_NAMES (gpt2: vocab.json and merges.txt; llama:
# tokenizer.model; bert: vocab.txt; t5: spiece.model) and processing_utils.py's chat_template.jinja.
TOKENIZER_FILE_NAMES = (
    TOKENIZER_JSON,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
)
# Where transformers keeps a tokenizer's end-of-text token, first found wins.
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_EOS_FILES = (TOKENIZER_CONFIG_FILE, "special_tokens_map.json")
HF_EXTRA = "pip install 'ladder[hf]' (or: pip install tokenizers)"


class TokenizerError(ValueError):
    """A tokenizer directory that cannot be used, said with the key, the value and the fix."""


def tokenizer_dir_problem(directory: str | Path, *, key: str) -> str | None:
    """What keeps ``directory`` (the value of ``key``) from being a tokenizer directory, or None."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        return (
            f"{key}={directory}: no such directory; point it at a Hugging Face tokenizer directory "
            f"(what tokenizer.save_pretrained(DIR) writes, holding {TOKENIZER_JSON})"
        )
    if not (path / TOKENIZER_JSON).is_file():
        return (
            f"{key}={directory} holds no {TOKENIZER_JSON}; save the tokenizer with a fast tokenizer "
            f"(transformers' AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(DIR))"
        )
    return None


def tokenizer_files(directory: str | Path) -> list[Path]:
    """The tokenizer's files in ``directory`` (TOKENIZER_FILE_NAMES that are there), sorted by name:
    what a copy of the tokenizer needs, and nothing of a model stored beside it."""
    path = Path(directory).expanduser()
    return sorted((path / name for name in TOKENIZER_FILE_NAMES if (path / name).is_file()), key=str)


def tokenizer_sha256(directory: str | Path) -> str:
    """sha256 over the tokenizer's files in name order, each as its name, a NUL and its bytes' sha256."""
    digest = hashlib.sha256()
    for file in tokenizer_files(directory):
        digest.update(file.name.encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def tokenizer_identity(directory: str | Path) -> TokenizerRecord:
    """Which tokenizer this is, for summary.json: its directory, sha256 and file names."""
    return {
        "path": str(Path(directory).expanduser().resolve()),
        "sha256": tokenizer_sha256(directory),
        "files": [file.name for file in tokenizer_files(directory)],
    }


# ladder export's record beside the files it wrote (runner/checkpoint/hf_export.py PROVENANCE_FILE),
# and its key for the sha256 of a tokenizer copy in which it named the end-of-text token.
EXPORT_RECORD = "ladder_export.json"
EOS_NAMED_KEY: Final = "eos_named_sha256"


def tokenizer_shas(directory: str | Path) -> set[str]:
    """The sha256s the tokenizer in ``directory`` answers to: its files', and, for a copy in which
    ``ladder export`` named the end-of-text token the run's token files were ended with, the run's
    tokenizer's, while the files are as the export wrote them (its record says both)."""
    own = tokenizer_sha256(directory)
    try:
        record = json.loads((Path(directory).expanduser() / EXPORT_RECORD).read_text())["tokenizer"]
    except (OSError, ValueError, KeyError, TypeError):
        return {own}
    if (
        isinstance(record, dict)
        and record.get(EOS_NAMED_KEY) == own
        and isinstance(record.get("sha256"), str)
    ):
        return {own, record["sha256"]}
    return {own}


def run_tokenizer_record(tokenizer_dir: str, data_path: str | None) -> TokenizerRecord:
    """summary.json's ``tokenizer``: :func:`tokenizer_identity`, and ``eos_token``, the token that
    ends each document of ``data_path`` where ``ladder tokenize`` wrote it in the shard's header
    (its ``--eos``, which the tokenizer's own files may not name)."""
    record = tokenizer_identity(tokenizer_dir)
    files = token_files(data_path) if data_path else []
    ended_by = llmc_eos_id(files[0]) if files and files[0].is_file() else None
    if ended_by is not None:
        token = load_tokenizer(tokenizer_dir, key="data.tokenizer").id_to_token(ended_by)
        if token is not None:
            record["eos_token"] = token
    return record


def load_tokenizer(directory: str | Path, *, key: str) -> Tokenizer:
    """The tokenizer in ``directory`` (the value of ``key``), read from its tokenizer.json offline."""
    problem = tokenizer_dir_problem(directory, key=key)
    if problem is not None:
        raise TokenizerError(problem)
    try:
        from tokenizers import Tokenizer  # deferred: only runs that name a tokenizer need it
    except ImportError as error:
        raise TokenizerError(f"{key}={directory} needs the tokenizers package: {HF_EXTRA}") from error
    try:
        return Tokenizer.from_file(str(Path(directory).expanduser() / TOKENIZER_JSON))
    except Exception as error:  # tokenizers raises a bare Exception on a malformed file
        raise TokenizerError(
            f"{key}={directory}: its {TOKENIZER_JSON} does not load ({error}); save it again with "
            f"tokenizer.save_pretrained(DIR)"
        ) from error


def vocab_size(tokenizer: Tokenizer) -> int:
    """The ids the tokenizer can produce: its largest id, added tokens included, plus one
    (what model.vocab_size must reach)."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def _token_text(value: Any) -> str | None:
    """A special token as transformers saves it: a string, or an AddedToken's dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def eos_token(directory: str | Path) -> str | None:
    """The tokenizer's end-of-text token, from tokenizer_config.json or special_tokens_map.json."""
    for name in _EOS_FILES:
        file = Path(directory).expanduser() / name
        if not file.is_file():
            continue
        try:
            saved = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        token = _token_text(saved.get("eos_token")) if isinstance(saved, dict) else None
        if token is not None:
            return token
    return None


def eos_id(tokenizer: Tokenizer, directory: str | Path, override: str | None, *, key: str) -> tuple[str, int]:
    """The token that ends each document and its id: ``override`` (--eos) or the directory's own."""
    token = override if override is not None else eos_token(directory)
    if token is None:
        raise TokenizerError(
            f"{key}={directory} names no end-of-text token (no eos_token in {' or '.join(_EOS_FILES)}); "
            f"give it with --eos TOKEN (e.g. --eos '<|endoftext|>')"
        )
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        where = "--eos" if override is not None else f"{key}={directory}'s eos_token"
        raise TokenizerError(
            f"{where}={token!r} is not in the tokenizer's vocabulary; give a token it holds with --eos TOKEN"
        )
    return token, token_id


__all__ = [
    "TOKENIZER_FILE_NAMES",
    "TokenizerError",
    "eos_id",
    "eos_token",
    "load_tokenizer",
    "run_tokenizer_record",
    "tokenizer_dir_problem",
    "tokenizer_files",
    "tokenizer_identity",
    "tokenizer_sha256",
    "vocab_size",
]
