"""Batches: the same global batch under any layout, reproducible from (seed, step)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from runner.config import DataConfig, DataName
from runner.data.batches import BatchSource, builtin_held_out_text, builtin_text, rank_slice
from runner.data.token_file import TokenShards, open_tokens, token_file_problem

pytestmark = pytest.mark.unit

TEXT = DataConfig(name=DataName.text, seq_len=32)
SYNTHETIC = DataConfig(name=DataName.synthetic, seq_len=32)
GLOBAL = 16


def _layout_batch(source: BatchSource, step: int, dp: int, accum: int, micro: int) -> torch.Tensor:
    """Every rank's micro-batches of one step, concatenated in rank_slice order."""
    assert dp * accum * micro == source.global_size
    parts = []
    for rank in range(dp):
        for i in range(accum):
            inputs, _ = source.micro_batch(step, rank_slice(rank, i, micro, accum), micro)
            assert inputs.shape == (micro, source.seq_len)
            parts.append(inputs)
    return torch.cat(parts)


def test_rank_slice_is_rank_major() -> None:
    """dp rank r owns a contiguous block of micro * accum sequences."""
    assert [rank_slice(r, i, 4, 2) for r in range(2) for i in range(2)] == [0, 4, 8, 12]
    assert rank_slice(3, 1, 2, 4) == 26
    with pytest.raises(ValueError, match=r"accum_steps=2"):
        rank_slice(0, 2, 4, 2)


@pytest.mark.parametrize("data_cfg", [TEXT, SYNTHETIC], ids=["text", "synthetic"])
def test_global_batch_is_independent_of_layout(data_cfg: DataConfig) -> None:
    """dp=2 x accum=2 x micro=4, dp=1 x accum=4 x micro=4 and dp=1 x micro=16 agree."""
    source = BatchSource(data_cfg, vocab_size=256, seed=0, global_size=GLOBAL)
    for step in (0, 7):
        reference = _layout_batch(source, step, dp=1, accum=1, micro=16)
        assert torch.equal(_layout_batch(source, step, dp=1, accum=4, micro=4), reference)
        assert torch.equal(_layout_batch(source, step, dp=2, accum=2, micro=4), reference)
        # Computed by another process (a fresh source) at another layout.
        other = BatchSource(data_cfg, vocab_size=256, seed=0, global_size=GLOBAL)
        assert torch.equal(_layout_batch(other, step, dp=4, accum=1, micro=4), reference)


@pytest.mark.parametrize("data_cfg", [TEXT, SYNTHETIC], ids=["text", "synthetic"])
def test_steps_differ_and_seed_reproduces(data_cfg: DataConfig) -> None:
    """Step t's batch depends on (seed, t) only: reproducible, distinct across steps and seeds."""
    a = BatchSource(data_cfg, vocab_size=256, seed=1, global_size=GLOBAL)
    b = BatchSource(data_cfg, vocab_size=256, seed=1, global_size=GLOBAL)
    c = BatchSource(data_cfg, vocab_size=256, seed=2, global_size=GLOBAL)
    b.global_batch(5)  # history does not matter: resume at step t needs only t
    step3 = a.global_batch(3)[0]
    assert torch.equal(step3, b.global_batch(3)[0])
    assert not torch.equal(step3, a.global_batch(4)[0])
    assert not torch.equal(step3, c.global_batch(3)[0])
    assert len({tuple(row.tolist()) for row in step3}) == GLOBAL  # distinct sequences


@pytest.mark.parametrize("data_cfg", [TEXT, SYNTHETIC], ids=["text", "synthetic"])
def test_skip_steps_reads_on_from_step_n(data_cfg: DataConfig) -> None:
    """data.skip_steps=N: step t is step t + N of the unshifted stream; evaluation is not shifted."""
    plain = BatchSource(data_cfg, vocab_size=256, seed=0, global_size=GLOBAL)
    shifted_cfg = dataclasses.replace(data_cfg, skip_steps=3)
    shifted = BatchSource(shifted_cfg, vocab_size=256, seed=0, global_size=GLOBAL)
    for step in (0, 2):
        assert torch.equal(shifted.global_batch(step)[0], plain.global_batch(step + 3)[0])
    held_out = BatchSource(shifted_cfg, vocab_size=256, seed=0, global_size=GLOBAL, held_out=True)
    unshifted = BatchSource(data_cfg, vocab_size=256, seed=0, global_size=GLOBAL, held_out=True)
    assert torch.equal(held_out.global_batch(0)[0], unshifted.global_batch(0)[0])


@pytest.mark.parametrize("data_cfg", [TEXT, SYNTHETIC], ids=["text", "synthetic"])
def test_targets_are_inputs_shifted(data_cfg: DataConfig) -> None:
    """int64 (size, seq_len) inputs and targets; targets[t] is the token after inputs[t]."""
    source = BatchSource(data_cfg, vocab_size=256, seed=0, global_size=GLOBAL)
    inputs, targets = source.micro_batch(2, 3, 5)
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.shape == targets.shape == (5, data_cfg.seq_len)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_synthetic_tokens_in_range() -> None:
    """Synthetic ids cover [0, vocab) and nothing outside it."""
    source = BatchSource(SYNTHETIC, vocab_size=50, seed=0, global_size=GLOBAL)
    inputs, targets = source.global_batch(0)
    both = torch.cat([inputs, targets])
    assert int(both.min()) == 0 and int(both.max()) == 49


def test_builtin_text_is_python_source_and_cached() -> None:
    """The built-in corpus is stdlib source, capped at max_bytes and built once."""
    builtin_text.cache_clear()
    corpus = builtin_text(2_000_000)
    assert corpus.dtype == np.uint8 and len(corpus) == 2_000_000
    assert builtin_text(2_000_000) is corpus
    text = corpus[:200_000].tobytes().decode("utf-8", errors="replace")
    assert "def " in text and "import " in text


def test_builtin_text_needs_a_byte_vocab() -> None:
    """Byte tokens under a smaller vocabulary are rejected, naming model.vocab_size."""
    with pytest.raises(ValueError, match=r"model.vocab_size=100; set model.vocab_size=256"):
        BatchSource(TEXT, vocab_size=100, seed=0, global_size=GLOBAL)


def test_token_file_is_memory_mapped_windows(tmp_path: Path) -> None:
    """A raw uint16 file: each sequence is a contiguous window of the file."""
    path = tmp_path / "tokens.bin"
    ids = np.arange(1000, dtype=np.uint16) + 1000  # ids 1000 .. 1999
    ids.tofile(path)
    data_cfg = dataclasses.replace(TEXT, path=str(path), dtype="uint16")
    source = BatchSource(data_cfg, vocab_size=2000, seed=0, global_size=GLOBAL)
    assert isinstance(source.tokens, np.memmap)
    inputs, targets = source.global_batch(0)
    offsets = torch.from_numpy(source.offsets(0)).unsqueeze(1)  # (GLOBAL, 1)
    assert torch.equal(inputs, 1000 + offsets + torch.arange(32))
    assert torch.equal(targets, inputs + 1)
    assert int(offsets.max()) <= 1000 - 33  # the last window still has seq_len + 1 tokens
    assert torch.equal(_layout_batch(source, 0, dp=2, accum=2, micro=4), inputs)


def test_token_file_errors_name_the_key_value_and_fix(tmp_path: Path) -> None:
    """Missing file, ids beyond the vocabulary, wrong dtype: clear ValueErrors."""
    missing = tmp_path / "nope.bin"
    with pytest.raises(ValueError, match=r"data.path='.*nope.bin' does not exist"):
        BatchSource(dataclasses.replace(TEXT, path=str(missing)), 256, 0, GLOBAL)

    path = tmp_path / "tokens.bin"
    np.array([1, 2, 3, 700] * 100, dtype=np.uint16).tofile(path)
    too_big = dataclasses.replace(TEXT, path=str(path))
    with pytest.raises(ValueError, match=r"token id 700 >= model.vocab_size=256; set"):
        BatchSource(too_big, 256, 0, GLOBAL)

    with pytest.raises(ValueError, match=r"data.dtype='int64' is not one of"):
        BatchSource(dataclasses.replace(too_big, dtype="int64"), 1000, 0, GLOBAL)

    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match=r"not a positive multiple of 2"):
        BatchSource(dataclasses.replace(TEXT, path=str(odd)), 256, 0, GLOBAL)

    short = tmp_path / "short.bin"
    np.arange(10, dtype=np.uint16).tofile(short)
    with pytest.raises(ValueError, match=r"lower data\.seq_len"):
        BatchSource(dataclasses.replace(TEXT, path=str(short)), 256, 0, GLOBAL)


def test_micro_batch_outside_the_global_batch_is_rejected() -> None:
    """Asking past global_size is a layout bug, not a silent wrap-around."""
    source = BatchSource(SYNTHETIC, 256, 0, GLOBAL)
    with pytest.raises(ValueError, match=r"\[12, 20\)"):
        source.micro_batch(0, 12, 8)


def test_large_token_file_is_sampled_then_checked_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the scan limit, start-up checks sampled chunks and each batch checks itself."""
    import runner.data.token_file

    monkeypatch.setattr(runner.data.token_file, "_SCAN_TOKENS", 16)
    monkeypatch.setattr(runner.data.token_file, "_SCAN_CHUNK", 4)  # samples [0:4], [20:24], [40:44], [60:64]
    ids = np.zeros(64, dtype=np.uint16)
    ids[62] = 999  # in a sampled chunk: caught at start-up
    path = tmp_path / "tokens.bin"
    ids.tofile(path)
    data_cfg = dataclasses.replace(TEXT, seq_len=63, path=str(path))
    with pytest.raises(ValueError, match=r"token id 999 >= model\.vocab_size=256"):
        BatchSource(data_cfg, 256, 0, GLOBAL)
    ids[62], ids[10] = 0, 999  # between sampled chunks: caught when a batch reads it
    ids.tofile(path)
    source = BatchSource(data_cfg, 256, 0, GLOBAL)
    with pytest.raises(ValueError, match=r"step 0 read token id 999 >= model\.vocab_size=256"):
        source.micro_batch(0, 0, 1)


def _llmc_shard(path: Path, ids: np.ndarray, magic: int = 20240520, version: int = 1) -> None:
    """A shard as llm.c's dev/data/data_common.py writes it: 256 int32 of header, then the ids."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, len(ids)
    path.write_bytes(header.tobytes() + ids.tobytes())


def test_npy_llmc_shards_and_a_glob_give_the_raw_files_batches(tmp_path: Path) -> None:
    """The same ids as a raw uint16 file, a .npy of int64, an llm.c shard (uint16 and Llama 3's
    uint32) and three raw shards named by a glob: every step's batch is the raw file's."""
    ids = (np.arange(1000) * 7 % 1999).astype(np.uint16)
    raw = tmp_path / "raw.bin"
    ids.tofile(raw)
    np.save(tmp_path / "ids.npy", ids.astype(np.int64))
    _llmc_shard(tmp_path / "gpt2.bin", ids)
    _llmc_shard(tmp_path / "llama3.bin", ids.astype(np.uint32), magic=20240801, version=7)
    for index, part in enumerate(np.split(ids, [300, 301])):  # one shard of a single token
        part.tofile(tmp_path / f"shard_{index:03d}.bin")
    paths = ["ids.npy", "gpt2.bin", "llama3.bin", "shard_*.bin"]

    def batches(path: Path | str) -> list[torch.Tensor]:
        source = BatchSource(dataclasses.replace(TEXT, path=str(path)), 2000, 0, GLOBAL)
        return [source.global_batch(step)[0] for step in range(3)]

    expected = batches(raw)
    for path in paths:
        assert all(torch.equal(a, b) for a, b in zip(batches(tmp_path / path), expected, strict=True)), path
    words = {path: open_tokens(str(tmp_path / path), "uint16", 2000)[1] for path in paths}
    assert words == {
        "ids.npy": "1,000 tokens in 1 file(s), .npy of int64",
        "gpt2.bin": "1,000 tokens in 1 file(s), llm.c shard of uint16",
        "llama3.bin": "1,000 tokens in 1 file(s), llm.c shard of uint32",
        "shard_*.bin": "1,000 tokens in 3 file(s), raw uint16",
    }


def test_token_shards_slice_across_their_boundaries() -> None:
    shards = TokenShards([np.arange(0, 3), np.arange(3, 4), np.arange(4, 10)])
    assert len(shards) == 10
    for start in range(10):
        for stop in range(start + 1, 11):
            assert shards[start:stop].tolist() == list(range(start, stop))


def test_npy_and_glob_refusals_name_the_file_and_the_fix(tmp_path: Path) -> None:
    np.save(tmp_path / "matrix.npy", np.zeros((4, 4), dtype=np.int32))
    problem = token_file_problem(str(tmp_path / "matrix.npy"), "uint16", 256, 2)
    assert problem is not None and "shape (4, 4)" in problem and "one dimension" in problem
    np.save(tmp_path / "negative.npy", np.array([1, -5, 3, 4], dtype=np.int64))
    problem = token_file_problem(str(tmp_path / "negative.npy"), "uint16", 256, 2)
    assert problem is not None and "token id -5 < 0" in problem
    problem = token_file_problem(str(tmp_path / "none_*.bin"), "uint16", 256, 2)
    assert problem is not None and "matches no file" in problem
    # A raw file whose first bytes only look like an llm.c header (its size disagrees) stays raw.
    looks = tmp_path / "looks.bin"
    header = np.zeros(256, dtype=np.int32)
    header[:3] = 20240520, 1, 5
    looks.write_bytes(header.tobytes()[:12] + bytes(20))
    assert open_tokens(str(looks), "uint16", 65536)[1] == "16 tokens in 1 file(s), raw uint16"


def test_held_out_batches_are_python_text_the_training_corpus_never_holds() -> None:
    """The evaluation's batches: the standard library's test suites, drawn by their own stream,
    the same at every evaluation and however the ranks cut them."""
    held_out_corpus = builtin_held_out_text()
    assert 100_000 < len(held_out_corpus) <= 2_000_000
    training = builtin_text(DataConfig().max_bytes).tobytes()
    for start in (0, len(held_out_corpus) // 2):
        assert held_out_corpus[start : start + 2000].tobytes() not in training
    cfg = DataConfig(seq_len=32)
    held_out = BatchSource(cfg, 256, seed=0, global_size=8, held_out=True)
    train = BatchSource(cfg, 256, seed=0, global_size=8)
    inputs, _ = held_out.global_batch(0)
    assert not torch.equal(inputs, train.global_batch(0)[0])
    again = BatchSource(cfg, 256, seed=0, global_size=8, held_out=True)
    halves = torch.cat([again.micro_batch(0, 0, 4)[0], again.micro_batch(0, 4, 4)[0]])
    assert torch.equal(inputs, halves)
    synthetic = DataConfig(name=DataName.synthetic, seq_len=32)
    assert not torch.equal(
        BatchSource(synthetic, 256, 0, 8, held_out=True).global_batch(0)[0],
        BatchSource(synthetic, 256, 0, 8).global_batch(0)[0],
    )
