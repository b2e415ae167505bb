"""A sequence-parallel run's checkpoint records its tensor-parallel degree as 1, not sp.

DeepSpeed 0.19.8 writes each model-state file's parallel dimensions from its ``mpu``
(engine.py ``_checkpoint_parallel_metadata``: ``bwc_tensor_model_parallel_world_size(mpu)``).
Its sequence-parallel state (deepspeed/runtime/sequence_parallel/parallel_state_sp.py, the
``mpu`` ALST and runner/parallel/sequence.py pass) aliases ``get_model_parallel_world_size`` to
the sequence group's size, so a checkpoint of sp 2 says tp 2. Its own universal conversion then
refuses it (checkpoint/reshape_3d_utils.py: "model-state file count 1 does not match pp_degree=1
* tp_degree=2"), so the run could not resume onto another layout. The weights are not split over
the sequence group: every sequence-parallel rank holds the same ones, as under data parallelism,
and its ZeRO files are cut over the sequence and data ranks together, which the conversion reads
as data-parallel ranks. :func:`install` makes the metadata say tp 1 where the ``mpu`` is that
sequence-parallel state, and leaves every other ``mpu`` (tensor and pipeline parallelism) as it was.
"""

from __future__ import annotations

from typing import Any


def install() -> None:
    """Wrap DeepSpeed's checkpoint metadata once per process (a no-op when already wrapped)."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.checkpoint.constants import CHECKPOINT_PARALLEL_DIMS, CHECKPOINT_TP_DEGREE
    from deepspeed.runtime import engine

    original = engine._checkpoint_parallel_metadata
    if getattr(original, "ladder_sequence_parallel", False):
        return

    def metadata(mpu: Any) -> dict[str, dict[str, int]]:
        dims: dict[str, dict[str, int]] = original(mpu)
        if mpu is not None and hasattr(mpu, "initialize_sequence_parallel"):
            dims[CHECKPOINT_PARALLEL_DIMS][CHECKPOINT_TP_DEGREE] = 1
        return dims

    metadata.ladder_sequence_parallel = True  # type: ignore[attr-defined]
    engine._checkpoint_parallel_metadata = metadata


__all__ = ["install"]
