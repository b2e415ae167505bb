"""Checkpointed blocks' inputs in host memory from forward to backward (``model.offload_activations``).

Under full recompute (runner/model/transformer.py ``checkpointed_block``) each block keeps only
its input for backward: p x micro x seq x d_model bytes a layer, 17 GB over Llama 3.1 8B's 32
layers at 64K tokens in bf16. Arctic Long Sequence Training moves those tensors to host memory
(ALST, arXiv 2506.13996, Sec. 3.3), and DeepSpeed 0.19.8 ships the mechanism:
deepspeed/runtime/activation_checkpointing/offload_activations.py ``CheckpointHiddenStatesOffload``,
a ``saved_tensors_hooks`` context that offloads the saved tensors marked for it and leaves every
other saved tensor alone. torch's non-reentrant checkpoint saves its inputs under the hooks
around it, so a block's input, marked just before its checkpoint, is packed by DeepSpeed's hook:
copied to a host buffer (pinned, on a side stream), and copied back when backward unpacks it.

DeepSpeed keeps the newest ``keep_last_count`` (1) marked inputs on the device, as backward needs
the last block's first, and skips tensors under ``min_offload_bytes`` (1 KiB) and every tensor of
a synchronized device (``_should_skip``): on CPU ranks nothing moves, the host being the device.
The plan counts the same (runner/memory_model/activations.py ``offloaded_block_inputs``).

The context must span a micro-batch's forward and its backward (its exit drops what is still
offloaded): runner/train/trainer.py enters :func:`offloading` around both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# DeepSpeed 0.19.8 CheckpointHiddenStatesOffload's defaults, which ladder keeps.
KEEP_LAST = 1  # ``keep_last_count``: the newest marked inputs that stay on the device
MIN_OFFLOAD_BYTES = 1024  # ``min_offload_bytes``: smaller tensors stay

# The offload a micro-batch runs in, while :func:`offloading` is open (innermost last).
_active: list[Any] = []


def checkpoint_offload() -> Any:
    """DeepSpeed's offload of the marked checkpoint inputs, with its defaults (one per rank: it keeps
    its host buffers from one micro-batch to the next)."""
    # Imported here: DeepSpeed's import is seconds, and the model is built where no rank runs.
    from deepspeed.runtime.activation_checkpointing.offload_activations import CheckpointHiddenStatesOffload

    return CheckpointHiddenStatesOffload(keep_last_count=KEEP_LAST, min_offload_bytes=MIN_OFFLOAD_BYTES)


@contextlib.contextmanager
def offloading(offload: Any) -> Iterator[Any]:
    """Run a micro-batch's forward and backward with ``offload`` (:func:`checkpoint_offload`) taking
    the block inputs :func:`mark_block_input` marks; yields it (its ``stats`` count what moved)."""
    with offload:
        _active.append(offload)
        try:
            yield offload
        finally:
            _active.remove(offload)


def mark_block_input(x: torch.Tensor) -> None:
    """Mark a checkpointed block's input for the open offload, if one is open (the checkpoint then
    saves it through the offload's hook)."""
    import torch  # deferred: the memory model reads this module's figures without torch

    if _active and torch.is_grad_enabled():
        _active[-1].mark(x)


__all__ = ["KEEP_LAST", "MIN_OFFLOAD_BYTES", "checkpoint_offload", "mark_block_input", "offloading"]
