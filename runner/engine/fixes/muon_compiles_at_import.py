"""Import DeepSpeed's Muon module with its kernels compiled at first call, not at import.

DeepSpeed imports its Muon optimizer module (``deepspeed/runtime/zero/muon/original_muon.py``)
whatever the optimizer: the engine's optimizer check under ZeRO (``runtime/zero/utils.py``
``is_zero_supported_optimizer``), stages 1-2 at each gradient reduction
(``stage_1_and_2.py`` ``average_tensor``), stage 3 as it is built, and ``BF16_Optimizer``
(bf16 at stage 0 under a pipeline). Its three Newton-Schulz kernels are decorated with
``torch.compile``, and decorating a function imports TorchInductor's compiler
(``torch._inductor.compile_fx``): measured 1.5 s of each rank's start-up and 44 MB of its
host memory (torch 2.13, DeepSpeed 0.19.8, a 2-core CPU), for kernels that only a Muon
optimizer runs, which ladder does not configure.

:func:`import_muon_deferred` imports the module once, before ``deepspeed.initialize``, with
``torch.compile`` standing in for a decorator that compiles the kernel on its first call
(what ``torch.compile`` itself does with a function: it compiles at the first call, only its
setup runs at decoration). DeepSpeed's later imports of the module find it in
``sys.modules``. A run with ``train.compile=true`` imports TorchInductor for its own blocks.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

MUON_MODULE = "deepspeed.runtime.zero.muon.original_muon"


def compile_at_first_call(real_compile: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for ``torch.compile`` used as a decorator: ``real_compile`` runs at the first call."""

    def deferred(model: Callable[..., Any] | None = None, **options: Any) -> Any:
        if model is None:  # @torch.compile(mode=...): options first, the function next
            return functools.partial(deferred, **options)
        compiled: Callable[..., Any] | None = None

        @functools.wraps(model)
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = real_compile(model, **options)
            return compiled(*args, **kwargs)

        return call

    return deferred


@contextmanager
def _torch_compile_deferred() -> Iterator[None]:
    real = torch.compile
    torch.compile = compile_at_first_call(real)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real  # type: ignore[assignment]


def import_muon_deferred() -> bool:
    """Import DeepSpeed's Muon module with its kernels' compilation deferred; False if it was
    already imported (compiled as DeepSpeed decorates it) or this DeepSpeed has none."""
    if MUON_MODULE in sys.modules:
        return False
    with _torch_compile_deferred():
        try:
            __import__(MUON_MODULE)
        except ImportError:  # a DeepSpeed before Muon: nothing of it is imported later either
            return False
    return True


__all__ = ["MUON_MODULE", "compile_at_first_call", "import_muon_deferred"]
