"""``ladder tokenize``: text, JSON Lines and Parquet to the token file ``data.path`` reads, with a
Hugging Face tokenizer trained here (nothing downloads); a run on it records the tokenizer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from train_helpers import clean_env, run_train

from runner.data.token_file import llmc_eos_id, llmc_tokenizer_sha256, open_tokens
from runner.data.tokenizer_dir import tokenizer_sha256

pytestmark = pytest.mark.e2e

LADDER = str(Path(sys.executable).parent / "ladder")
EOS = "<|endoftext|>"
VOCAB = 400
# Paragraphs of the standard library's own prose, and a few characters beyond ASCII.
PARAGRAPHS = [
    paragraph.strip()
    for doc in (json.__doc__, "café ✓ — naïve", shutil.__doc__, subprocess.__doc__)
    for paragraph in re.split(r"\n\s*\n", doc or "")
    if paragraph.strip()
]
TEXT = "\n\n".join(PARAGRAPHS)
# Enough JSON Lines documents for several chunks (runner/data/tokenize_text.py CHUNK_DOCUMENTS)
# over two workers: their order in the file is the inputs' order.
RECORDS = [f"record {i}: {PARAGRAPHS[i % len(PARAGRAPHS)][: 20 + i % 50]}" for i in range(3000)]
COLUMN = [*PARAGRAPHS[:5], None, *PARAGRAPHS[5:9]]


def _tokenizer_dir(root: Path) -> Path:
    """A byte-level BPE tokenizer trained on TEXT, saved as Hugging Face saves one."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(PARAGRAPHS * 4, trainer)
    directory = root / "tokenizer"
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS}))
    return directory


def tokenize(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``ladder tokenize args...`` as a user types it (piped: plain progress lines)."""
    command = [LADDER, "tokenize", *map(str, args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=clean_env())


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory) -> dict:
    """One text, one JSON Lines and one Parquet file tokenized together by two workers."""
    root = tmp_path_factory.mktemp("tokenize")
    directory = _tokenizer_dir(root)
    (root / "prose.txt").write_text(TEXT + "\n\n\n")
    (root / "records.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(RECORDS))
    )
    pq.write_table(pa.table({"body": pa.array(COLUMN, pa.string())}), root / "column.parquet")
    out = root / "tokens.bin"
    proc = tokenize(
        "--tokenizer", directory, "prose.txt", "records.jsonl", "column.parquet",
        "--split", "blank", "--column", "body", "--workers", "2", "--out", out, cwd=root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "tokenizer": directory, "out": out, "proc": proc}


def test_each_document_is_the_tokenizers_encoding_then_eos(tokenized):
    """Read back as data.path reads it: every document's own encoding followed by EOS, in input
    order, as an llm.c shard of uint16 that names its tokenizer; tokens/s said at the end."""
    tokenizer = Tokenizer.from_file(str(tokenized["tokenizer"] / "tokenizer.json"))
    eos = tokenizer.token_to_id(EOS)
    documents = [*PARAGRAPHS, *RECORDS, *(text for text in COLUMN if text)]
    expected = [i for doc in documents for i in [*tokenizer.encode(doc, add_special_tokens=False).ids, eos]]
    tokens, words = open_tokens(str(tokenized["out"]), "uint32", VOCAB)  # the header's dtype wins
    assert np.array_equal(np.asarray(tokens), np.array(expected))
    assert words == f"{len(expected):,} tokens in 1 file(s), llm.c shard of uint16"
    assert llmc_tokenizer_sha256(tokenized["out"]) == tokenizer_sha256(tokenized["tokenizer"])
    assert llmc_eos_id(tokenized["out"]) == eos  # the header names the token that ends documents
    stdout = tokenized["proc"].stdout
    assert f"{len(expected):,} tokens (uint16, llm.c shard) from {len(documents):,} documents" in stdout
    assert "tokens/s" in stdout and f"model.vocab_size={VOCAB}" in stdout
    assert "100% of" in tokenized["proc"].stderr


def test_a_bad_document_midway_leaves_the_earlier_file_untouched(tokenized, tmp_path):
    """A record without the field, after good input: exit 2 naming file, line and fix; the
    earlier --out as it was and no temporary file beside it."""
    good = tokenized["root"] / "records.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"body": "no text field"}\n')
    out = tmp_path / "tokens.bin"
    out.write_bytes(b"the earlier tokens")
    proc = tokenize("--tokenizer", tokenized["tokenizer"], good, bad, good, "--out", out, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{bad}:3 has no field --field='text' (it has: body); pass --field NAME" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert out.read_bytes() == b"the earlier tokens"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "tokens.bin"]


def test_a_missing_input_is_refused_before_anything_is_written(tokenized, tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    out = tmp_path / "tokens.bin"
    proc = tokenize("--tokenizer", tokenized["tokenizer"], missing, "--out", out, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"input {missing}: no such file; give existing text (.txt)" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_run_trains_on_the_tokens_and_records_its_tokenizer(tokenized, tmp_path):
    """The token file trains as data.path; summary.json names the tokenizer's sha256. A vocabulary
    larger than model.vocab_size, or another tokenizer than the file's, is refused before launch."""
    other = tmp_path / "tokenizer_b"
    shutil.copytree(tokenized["tokenizer"], other)
    (other / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "model_max_length": 64}))
    common = [f"data.path={tokenized['out']}", "logger=none", "data.seq_len=32"]
    runs = {
        "trained": [f"data.tokenizer={tokenized['tokenizer']}", f"model.vocab_size={VOCAB}"],
        "small vocab": [f"data.tokenizer={tokenized['tokenizer']}", f"model.vocab_size={VOCAB - 8}"],
        "other tokenizer": [f"data.tokenizer={other}", f"model.vocab_size={VOCAB}"],
    }
    steps = ["train.steps=2", "batch.global_size=4", "batch.micro_size=2"]
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            name: pool.submit(
                run_train, *overrides, *common, *steps, run_dir=tmp_path / name.replace(" ", "_")
            )
            for name, overrides in runs.items()
        }
    results = {name: future.result() for name, future in futures.items()}

    trained = results["trained"]
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert trained.summary["status"] == "completed"
    assert trained.summary["tokenizer"]["sha256"] == tokenizer_sha256(tokenized["tokenizer"])
    assert trained.summary["tokenizer"]["files"] == ["tokenizer.json", "tokenizer_config.json"]

    small = results["small vocab"]
    assert small.returncode == 2, small.stderr[-2000:]
    assert f"({VOCAB} in its vocabulary), more than model.vocab_size={VOCAB - 8}" in small.stderr
    assert f"set model.vocab_size={VOCAB} (or more)" in small.stderr
    assert not small.run_dir.exists()

    mismatched = results["other tokenizer"]
    assert mismatched.returncode == 2, mismatched.stderr[-2000:]
    assert "was tokenized with another tokenizer" in mismatched.stderr
    assert f"data.tokenizer={other}" in mismatched.stderr
    assert not mismatched.run_dir.exists()
