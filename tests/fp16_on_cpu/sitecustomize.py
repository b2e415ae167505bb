"""Tell DeepSpeed's CPU accelerator that this CPU has fp16 kernels (or, with
``LADDER_TEST_FP16_KERNELS=no``, that it has none).

On a PYTHONPATH, Python imports this module at start-up, in the test's ``train.py`` and in
every rank it starts. DeepSpeed 0.19.8 takes fp16 on a CPU only where oneDNN reports fp16
kernels (AVX512-FP16 or AMX-FP16), and ladder refuses it before launch where DeepSpeed
would (runner/preflight/validate.py ``fp16_supported``); torch computes fp16 on any CPU all the same,
only more slowly. With this, fp16's own code paths (DeepSpeed's FP16_UnfusedOptimizer and
its dynamic loss scale) run on a CI machine without those kernels: the answer to the
capability question is the only thing changed, once DeepSpeed's module is imported.
``LADDER_TEST_FP16_KERNELS=no`` answers no instead, so a host that has those kernels meets
the refusal a host without them gets (tests/e2e/test_fp16_kernels.py). Only a test puts this
directory on PYTHONPATH; ladder itself never reads the variable.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

ACCELERATOR_MODULE = "deepspeed.accelerator.cpu_accelerator"
ANSWER = os.environ.get("LADDER_TEST_FP16_KERNELS", "yes") != "no"


class _AnswerFp16Supported(importlib.abc.MetaPathFinder):
    """Finds DeepSpeed's CPU accelerator module as usual and patches its class once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != ACCELERATOR_MODULE:
            return None
        sys.meta_path.remove(self)  # the usual finders from here on
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_then_patch(module: ModuleType) -> None:
            run_module(module)
            module.CPU_Accelerator.is_fp16_supported = lambda self: ANSWER

        spec.loader.exec_module = run_then_patch  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _AnswerFp16Supported())
