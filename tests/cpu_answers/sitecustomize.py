"""Answer the questions ladder and DeepSpeed ask about this CPU's 16-bit kernels, as a test says.

On a PYTHONPATH, Python imports this module at start-up, in the test's ``train.py`` and in
every rank it starts. Each answer is patched into its module once that module has run; nothing
else changes. Only a test puts this directory on PYTHONPATH (tests/train_helpers.py
``cpu_answers_env``); ladder itself never reads these variables.

- ``LADDER_TEST_FP16_KERNELS`` (``yes``, the default, or ``no``): DeepSpeed's CPU accelerator's
  ``is_fp16_supported`` (accelerator/cpu_accelerator.py in DeepSpeed 0.19.8). DeepSpeed takes
  fp16 on a CPU only where oneDNN reports fp16 kernels (AVX512-FP16 or AMX-FP16), and ladder
  refuses it before launch where DeepSpeed would (runner/preflight/validate.py
  ``fp16_supported``); torch computes fp16 on any CPU all the same, only more slowly. ``yes``
  runs fp16's own code paths (DeepSpeed's FP16_UnfusedOptimizer and its dynamic loss scale) on
  a CPU without those kernels; ``no`` gives a CPU with them the refusal.
- ``LADDER_TEST_HALF_GEMM`` (``yes`` or ``no``; unset: torch's own answer):
  runner/hardware/cpu_half_matmul.py ``native_half_matmul`` for bf16 and fp16, so a rank
  computes its 16-bit matmuls in fp32 (``no``) or with torch's kernels (``yes``) on any CPU.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

FP16_KERNELS = os.environ.get("LADDER_TEST_FP16_KERNELS", "yes") != "no"
HALF_GEMM = os.environ.get("LADDER_TEST_HALF_GEMM")


def _answer_fp16(module: ModuleType) -> None:
    module.CPU_Accelerator.is_fp16_supported = lambda self: FP16_KERNELS


def _answer_half_gemm(module: ModuleType) -> None:
    native = HALF_GEMM == "yes"
    asked = module.native_half_matmul
    module.native_half_matmul = lambda dtype: native if dtype in module.HALF_DTYPES else asked(dtype)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds one module as usual and patches it once it has run."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # the usual finders from here on
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_then_patch(module: ModuleType) -> None:
            run_module(module)
            self.patch(module)

        spec.loader.exec_module = run_then_patch  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _PatchOnImport("deepspeed.accelerator.cpu_accelerator", _answer_fp16))
if HALF_GEMM is not None:
    sys.meta_path.insert(0, _PatchOnImport("runner.hardware.cpu_half_matmul", _answer_half_gemm))
