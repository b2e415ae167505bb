"""The built-in text: the Python standard library's own sources, as bytes, offline on every machine.

Training reads its modules (``builtin_text``); evaluation its test suites (``builtin_held_out_text``),
which the training corpus leaves out. Byte-level tokens, ids 0..255. Without torch, so that
validation before launch reads it cheaply.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from pathlib import Path

import numpy as np

# Tests and vendored packages are skipped: the former hold odd byte strings
# and generated data, the latter are not the standard library.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


@functools.lru_cache(maxsize=4)
def builtin_text(max_bytes: int) -> np.ndarray:
    """The standard library's .py sources as one read-only uint8 array, <= max_bytes."""
    if max_bytes < 1:
        raise ValueError(f"data.max_bytes={max_bytes} must be >= 1")
    root = sysconfig.get_paths()["stdlib"]
    chunks: list[bytes] = []
    total = 0
    # Sorted walk: the corpus (and so every batch) is the same on every call.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            try:
                data = Path(dirpath, name).read_bytes()
            except OSError:  # unreadable file in an odd install: skip it
                continue
            chunks.append(data[: max_bytes - total])
            total += len(chunks[-1])
            if total >= max_bytes:
                break
        if total >= max_bytes:
            break
    if total == 0:
        raise ValueError(
            f"no .py files found under the standard library at {root!r}; "
            "set data.path to a token file or use data=synthetic"
        )
    return np.frombuffer(b"".join(chunks), dtype=np.uint8)


# The held-out corpus of the built-in text: the standard library's own test suites, which the
# training corpus leaves out (_SKIP_DIRS), up to this many bytes.
HELD_OUT_MAX_BYTES = 2_000_000
_TEST_DIRS = frozenset({"test", "tests", "idle_test"})
_NOT_STDLIB = frozenset({"site-packages", "dist-packages", "__pycache__"})
# Evaluation draws its sequences from its own random stream: [seed, EVAL_STREAM, batch], where
# training draws [seed, step].
EVAL_STREAM = 1


@functools.lru_cache(maxsize=2)
def builtin_held_out_text(max_bytes: int = HELD_OUT_MAX_BYTES) -> np.ndarray:
    """The standard library's test-suite .py sources (Lib/test, idlelib/idle_test, ...) as bytes.

    Python text the training corpus never holds; empty where this Python ships without its test
    suite (Debian moves it to the libpython3.X-testsuite package).
    """
    root = sysconfig.get_paths()["stdlib"]
    chunks: list[bytes] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _NOT_STDLIB)
        if not _TEST_DIRS.intersection(Path(dirpath).relative_to(root).parts):
            continue
        for name in sorted(filenames):
            if name.endswith(".py") and total < max_bytes:
                try:
                    data = Path(dirpath, name).read_bytes()
                except OSError:
                    continue
                chunks.append(data[: max_bytes - total])
                total += len(chunks[-1])
    return np.frombuffer(b"".join(chunks), dtype=np.uint8)
