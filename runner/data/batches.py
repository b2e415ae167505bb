"""Training batches that do not depend on the parallel layout.

The contract. The global batch of optimizer step `t` is `global_size`
sequences of `seq_len + 1` tokens, numbered p = 0 .. global_size-1, and it is
fixed by (seed, t) alone:

- real tokens: sequence p starts at offset `offsets[p]`, where all
  `global_size` offsets of step t are drawn at once from
  `np.random.default_rng([seed, t])`; a caller asking for sequences
  `start .. start+size-1` takes `offsets[start:start+size]`;
- synthetic tokens: sequence p is drawn from `np.random.default_rng([seed, t, p])`.

``data.skip_steps=N`` shifts the stream: step t draws step t + N's batch, so a run started
from another run's weights after N steps (``model.init_from`` of its export) reads on where
that run stopped.

Inputs are the first `seq_len` tokens of each sequence and targets the last
`seq_len` (the inputs shifted by one token).

Whoever computes a step -- one rank with 16 sequences per micro-batch, or two
data-parallel ranks each accumulating 2 micro-batches of 4 -- the same
sequences form that step's global batch (`rank_slice` says which slice each
rank's micro-batch is). That is what keeps a layout change the same
experiment, and why resuming at step t needs nothing but t: there is no
iterator state to save. Sampling is with replacement, which is the usual
choice for LM pre-training when the corpus is far larger than what a run sees.

Token sources:

- built-in text: the `.py` files of this Python's own standard library,
  concatenated as bytes (byte-level tokens, ids 0..255, so model.vocab_size
  must be >= 256). Real text, offline, on every machine; the same Python
  version gives the same corpus.
- a user's token files (`data.path`): a raw binary array of token ids of
  `data.dtype` (e.g. `np.array(ids, np.uint16).tofile(path)`), a `.npy`, an llm.c
  shard, or a glob of shards read as one corpus (runner/data/token_file.py), memory-mapped.
- synthetic: uniform random ids in [0, vocab_size); for throughput runs.

Evaluation (``train.eval_every``) reads held-out tokens: ``data.val_path`` in the forms
``data.path`` takes, else the built-in text's held-out corpus, the standard library's test
suites (runner/data/text_corpus.py). Its batches b = 0 .. eval_batches-1 are drawn as a step's
are, from ``np.random.default_rng([seed, EVAL_STREAM, b])``, and cut over the ranks as a
step's: every evaluation of every layout reads the same sequences.
"""

from __future__ import annotations

import numpy as np
import torch

from runner.config import DataConfig, DataName
from runner.data.text_corpus import EVAL_STREAM, builtin_held_out_text, builtin_text
from runner.data.token_file import TokenShards, open_token_file


def rank_slice(dp_rank: int, micro_index: int, micro_size: int, accum_steps: int) -> int:
    """Index of the first sequence of a dp rank's `micro_index`-th micro-batch."""
    # Rank-major: dp rank r owns sequences [r*micro*accum, (r+1)*micro*accum)
    # of the global batch and walks through them one micro-batch at a time.
    if not 0 <= micro_index < accum_steps:
        raise ValueError(f"micro_index={micro_index} not in [0, accum_steps={accum_steps})")
    if dp_rank < 0 or micro_size < 1:
        raise ValueError(f"need dp_rank >= 0 and micro_size >= 1, got {dp_rank}, {micro_size}")
    return dp_rank * micro_size * accum_steps + micro_index * micro_size


class BatchSource:
    """Any slice of any step's global batch, computed from (seed, step) alone.

    ``held_out=True``: the evaluation's batches instead, numbered 0, 1, ... and drawn from the
    held-out tokens (``data.val_path``, else the built-in text's held-out corpus) by a random
    stream of their own, so every evaluation of every layout reads the same sequences.
    """

    def __init__(
        self, data_cfg: DataConfig, vocab_size: int, seed: int, global_size: int, *, held_out: bool = False
    ) -> None:
        if data_cfg.seq_len < 1 or global_size < 1 or seed < 0:
            raise ValueError(
                f"need data.seq_len >= 1, global_size >= 1 and seed >= 0; got "
                f"{data_cfg.seq_len}, {global_size}, {seed}"
            )
        self.seq_len = data_cfg.seq_len
        self.vocab_size = vocab_size
        self.seed = seed
        self.global_size = global_size
        self._stream = (EVAL_STREAM,) if held_out else ()
        # data.skip_steps: step t draws what step t + skip_steps draws (training batches only).
        self._skip = 0 if held_out else data_cfg.skip_steps
        self.tokens: np.ndarray | TokenShards | None = None  # None: synthetic
        if data_cfg.name == DataName.synthetic:
            return
        if held_out:
            self.tokens = (
                open_token_file(data_cfg.val_path, data_cfg.dtype, vocab_size, key="data.val_path")
                if data_cfg.val_path is not None
                else builtin_held_out_text()
            )
        elif data_cfg.path is not None:
            self.tokens = open_token_file(data_cfg.path, data_cfg.dtype, vocab_size)
        else:
            self.tokens = builtin_text(data_cfg.max_bytes)
            max_id = int(self.tokens.max())
            if max_id >= vocab_size:
                raise ValueError(
                    f"the built-in text is byte-level (this corpus has ids up to "
                    f"{max_id}) but model.vocab_size={vocab_size}; set "
                    "model.vocab_size=256 or use data=synthetic"
                )
        if len(self.tokens) < self.seq_len + 1:
            raise ValueError(
                f"the corpus holds {len(self.tokens)} tokens, fewer than "
                f"data.seq_len + 1 = {self.seq_len + 1}; lower data.seq_len "
                "or give more data"
            )

    def offsets(self, step: int) -> np.ndarray:
        """Start offsets of all global_size sequences of step `step` (real tokens)."""
        if self.tokens is None:
            raise ValueError("synthetic data has no offsets")
        rng = np.random.default_rng([self.seed, *self._stream, step + self._skip])
        # The last start that still leaves seq_len + 1 tokens is len - seq_len - 1.
        high = len(self.tokens) - self.seq_len
        return rng.integers(0, high, size=self.global_size)

    def micro_batch(self, step: int, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, int64 (size, seq_len), of sequences start..start+size-1."""
        if step < 0 or start < 0 or size < 1 or start + size > self.global_size:
            raise ValueError(
                f"step={step}, sequences [{start}, {start + size}) are not within "
                f"step >= 0 and the global batch [0, {self.global_size})"
            )
        L = self.seq_len + 1
        if self.tokens is None:
            rows = [
                np.random.default_rng([self.seed, *self._stream, step + self._skip, p]).integers(
                    0, self.vocab_size, size=L
                )
                for p in range(start, start + size)
            ]
        else:
            offs = self.offsets(step)[start : start + size]
            rows = [self.tokens[o : o + L] for o in offs]
        seqs = torch.from_numpy(np.stack(rows).astype(np.int64))  # (size, seq_len+1)
        if self.tokens is not None and int(seqs.max()) >= self.vocab_size:
            # Only reachable for large token files not scanned whole at start-up.
            raise ValueError(
                f"step {step} read token id {int(seqs.max())} >= model.vocab_size="
                f"{self.vocab_size}; set model.vocab_size to the tokenizer's size"
            )
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole global batch of step `step` (for tests and single-rank runs)."""
        return self.micro_batch(step, 0, self.global_size)
