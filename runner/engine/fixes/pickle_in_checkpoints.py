"""Checkpoint files load with ``torch.load(weights_only=True)``: tensors and plain data, never code.

A pickle may name any callable, and ``torch.load(weights_only=False)`` calls it: a doctored
checkpoint file runs code in every rank that loads it. DeepSpeed 0.19.8 loads its own files
that way (``TorchCheckpointEngine.load``; the universal checkpoint's
``runtime/base_optimizer.py`` ``load_hp_checkpoint_state_from_checkpoint_dir``,
``checkpoint/universal_checkpoint.py`` ``load_hp_checkpoint_state``; ``ds_to_universal``).
Here every such load goes through :func:`load`: the weights-only unpickler, which allows
tensors, containers and numbers, plus exactly the DeepSpeed types its checkpoints hold
(:func:`deepspeed_globals`, found by listing the globals of the pickles that stages 0-3 in
fp32, bf16 and fp16, with and without a pipeline, and their universal conversions, write).
Anything else is refused with :class:`UnsafeCheckpointError` before it runs.

Two hooks, because DeepSpeed routes some loads through its checkpoint engine and reads
others with ``torch.load`` directly: :class:`SafeCheckpointEngine` replaces the engine's
checkpoint engine, and :func:`weights_only_loads` holds ``torch.load`` to weights-only
for the time of one ``engine.load_checkpoint`` call (or of the ``ds_to_universal``
conversion: ``python -m runner.engine.fixes.pickle_in_checkpoints --input_folder ... --output_folder ...``).
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from runner.engine.deepspeed_engine import DeepSpeedEngine

_torch_load = torch.load  # the real one, also while weights_only_loads() holds torch.load


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file holds an object that loading it would have to construct by running code."""


def deepspeed_globals() -> list[Any]:
    """The non-tensor types DeepSpeed 0.19.8's checkpoints pickle (ZeRO 1-3, bf16, universal)."""
    # Deferred: DeepSpeed's loss scaler, ZeRO config and tensor fragments load with a rank's engine.
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    # LossScaler, DynamicLossScaler: the ZeRO optimizers' loss_scaler (static, or fp16's
    # dynamic one); ZeroStageEnum: zero_stage of the optimizer state; fragment_address:
    # param_slice_mappings of ZeRO 1/2 and bf16.
    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load(path: Any, map_location: Any = None) -> Any:
    """``torch.load(path, weights_only=True)`` with DeepSpeed's types allowed; refuses anything else."""
    try:
        with torch.serialization.safe_globals(deepspeed_globals()):
            return _torch_load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"refused to load {path}: it holds an object that only code could build, which loading "
            f"would run. ladder and DeepSpeed never write such a file: it was altered or comes from "
            f"elsewhere. Delete that checkpoint (the run resumes from an earlier one, or start a new "
            f"run directory). Unpickler: {_reason(error)}"
        ) from None


def _reason(error: Exception) -> str:
    """The line of torch's weights-only error that names the refused global (not its advice)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line]
    return (named or lines or [type(error).__name__])[0]


class SafeCheckpointEngine(TorchCheckpointEngine):  # type: ignore[misc]
    """DeepSpeed's torch checkpoint engine, loading with :func:`load` (saving is unchanged)."""

    def load(self, path: str, map_location: Any = None) -> Any:
        """One checkpoint file, weights only."""
        return load(path, map_location=map_location)


def install(engine: DeepSpeedEngine) -> None:
    """Give ``engine`` the weights-only checkpoint engine, keeping its serialization setting."""
    if type(engine.checkpoint_engine) is TorchCheckpointEngine:
        safe = SafeCheckpointEngine()
        safe.zipfile_serialization = engine.checkpoint_engine.zipfile_serialization
        engine.checkpoint_engine = safe


def _forced_load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
    """Stands in for ``torch.load`` inside :func:`weights_only_loads`: whatever the caller asked."""
    return load(f, map_location=map_location)


@contextmanager
def weights_only_loads() -> Iterator[None]:
    """Hold every ``torch.load`` of this process to :func:`load` (DeepSpeed's direct loads)."""
    torch.load = _forced_load
    try:
        yield
    finally:
        torch.load = _torch_load


def convert_to_universal(argv: list[str]) -> None:
    """``ds_to_universal`` with weights-only loads (its process-pool workers fork: they inherit the hold)."""
    # Deferred: only a conversion to the universal format runs ds_to_universal.
    from deepspeed.checkpoint import ds_to_universal

    from runner.engine.fixes import stateless_optimizer_universal

    stateless_optimizer_universal.install()
    sys.argv = ["ds_to_universal", *argv]
    with weights_only_loads():
        ds_to_universal.main(ds_to_universal.parse_arguments())


if __name__ == "__main__":
    convert_to_universal(sys.argv[1:])
