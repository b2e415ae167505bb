"""``ladder tokenize``'s progress on stderr: a rich bar on a terminal, else a line at each tenth
of the input, and the closing lines with tokens/s."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from runner.data.tokenize_text import ProgressCallback, TokenizeResult

PREFIX = "ladder tokenize"
_PLAIN_STEPS = 10  # lines a run without a terminal prints, one per tenth of the input


@contextmanager
def tokenize_progress(total_bytes: int, console: Console) -> Iterator[ProgressCallback]:
    """A callback that shows each chunk written: bytes in against ``total_bytes``, tokens so far."""
    done = {"bytes": 0, "docs": 0, "tokens": 0}

    def count(bytes_in: int, documents: int, tokens: int) -> None:
        done["bytes"] += bytes_in
        done["docs"] += documents
        done["tokens"] += tokens

    if console.is_terminal:
        columns = (
            TextColumn("[bold]tokenize"),
            BarColumn(),
            TaskProgressColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[tokens]:,} tokens"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("tokenize", total=total_bytes, tokens=0)

            def show(bytes_in: int, documents: int, tokens: int) -> None:
                count(bytes_in, documents, tokens)
                bar.update(task, completed=done["bytes"], tokens=done["tokens"])

            yield show
        return
    shown = 0

    def plain(bytes_in: int, documents: int, tokens: int) -> None:
        nonlocal shown
        count(bytes_in, documents, tokens)
        reached = done["bytes"] * _PLAIN_STEPS // max(total_bytes, 1)
        if reached > shown:
            shown = reached
            console.print(
                f"{PREFIX}: {min(reached * 100 // _PLAIN_STEPS, 100)}% of {total_bytes / 1e6:,.1f} MB, "
                f"{done['docs']:,} documents, {done['tokens']:,} tokens",
                highlight=False,
            )

    yield plain


def result_lines(result: TokenizeResult, tokenizer_dir: str, workers: int) -> list[str]:
    """What a finished run says: the file, its counts, its speed (MB = 1e6 bytes), and how to train on it
    or hold it out (the command cannot tell a training file from a validation one)."""
    seconds = max(result.seconds, 1e-9)
    mb_in, mb_out = result.bytes_in / 1e6, result.bytes_out / 1e6
    return [
        f"{PREFIX}: wrote {result.out}: {result.tokens:,} tokens ({result.dtype}, llm.c shard) from "
        f"{result.documents:,} documents, each ended by {result.eos!r}",
        f"  {mb_in:,.1f} MB in, {mb_out:,.1f} MB out in {result.seconds:.1f} s with {workers} worker(s): "
        f"{result.tokens_per_s:,.0f} tokens/s, {mb_in / seconds:.2f} MB/s",
        f"  tokenizer sha256 {result.tokenizer_sha256}, vocabulary {result.vocab_size:,}",
        f"  train on it: python train.py data.path={result.out} data.tokenizer={tokenizer_dir} "
        f"model.vocab_size={result.vocab_size}",
        f"  or hold it out (a validation set): data.val_path={result.out} beside a run's own data.path",
    ]


__all__ = ["result_lines", "tokenize_progress"]
