"""What ``ladder tokenize`` says when it is done (runner/data/tokenize_progress.py ``result_lines``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.data.tokenize_progress import result_lines
from runner.data.tokenize_text import TokenizeResult

pytestmark = pytest.mark.unit


def test_a_tokenized_file_is_offered_for_training_and_for_holding_out():
    """The command cannot tell a validation file from a training one: it names both uses."""
    result = TokenizeResult(
        out=Path("val.bin"), tokens=1000, documents=10, bytes_in=4000, bytes_out=2000, seconds=0.5,
        dtype="uint16", vocab_size=32000, eos="</s>", tokenizer_sha256="abc",
    )  # fmt: skip
    lines = result_lines(result, "tok", workers=1)
    assert (
        "  train on it: python train.py data.path=val.bin data.tokenizer=tok model.vocab_size=32000" in lines
    )
    assert (
        lines[-1] == "  or hold it out (a validation set): data.val_path=val.bin beside a run's own data.path"
    )
