"""DeepSpeed's Muon module imported without TorchInductor: its kernels compile at their first call."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from train_helpers import ROOT

from runner.engine.fixes.muon_compiles_at_import import compile_at_first_call

pytestmark = pytest.mark.unit


def test_a_kernel_compiles_at_its_first_call_once_with_its_options():
    compiled: list[tuple[str, dict]] = []

    def real_compile(model, **options):
        compiled.append((model.__name__, options))
        return lambda x: ("compiled", model(x))

    deferred = compile_at_first_call(real_compile)

    @deferred
    def double(x):
        return 2 * x

    @deferred(dynamic=True)
    def square(x):
        return x * x

    assert compiled == []  # decorating compiles nothing
    assert double(3) == ("compiled", 6) and double(4) == ("compiled", 8)
    assert square(3) == ("compiled", 9)
    assert compiled == [("double", {}), ("square", {"dynamic": True})]  # once each
    assert double.__name__ == "double" and double.__wrapped__(5) == 10


def test_a_zero_rank_imports_deepspeeds_muon_module_without_torchinductor():
    """What DeepSpeed's ZeRO check imports, after ladder's import: the class its isinstance checks
    need, and no TorchInductor; a plain import, as DeepSpeed makes it, brings TorchInductor in."""
    probe = (
        "import json, sys, torch, deepspeed, torch._dynamo\n"
        "from runner.engine.fixes.muon_compiles_at_import import import_muon_deferred\n"
        "first = import_muon_deferred() if sys.argv[1] == 'ladder' else None\n"
        "from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam\n"
        "print(json.dumps({'first': first, 'optimizer': issubclass(MuonWithAuxAdam, torch.optim.Optimizer),\n"
        "                  'inductor': 'torch._inductor.compile_fx' in sys.modules,\n"
        "                  'again': import_muon_deferred()}))\n"
    )
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    seen = {}
    for how in ("ladder", "plain"):
        done = subprocess.run(
            [sys.executable, "-c", probe, how], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen[how] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["ladder"] == {"first": True, "optimizer": True, "inductor": False, "again": False}
    assert seen["plain"] == {"first": None, "optimizer": True, "inductor": True, "again": False}
