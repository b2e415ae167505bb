"""Per-device memory estimates (model states, DeepSpeed's buffers, activations) in bytes: the
estimator API under its long-standing names, re-exported from the package runner.memory_model
(runner/memory_model/states.py, activations.py, units.py), where they are defined and cited.
"""

from __future__ import annotations

from runner.memory_model.activations import (
    TRANSIENT_ITEMS,
    BlockGraph,
    BlockShape,
    activation_items_outside_blocks,
    activation_items_per_layer,
    activation_items_total,
    activations_per_layer,
    activations_total,
    after_the_head,
    at_the_loss,
    block_graph,
    korthikanti_activation_items,
    korthikanti_activations_per_layer,
    model_block_shape,
    transient_peak,
)
from runner.memory_model.states import (
    ModelStates,
    bytes_per_param,
    deepspeed_residuals,
    model_states,
    offload_host_buffers,
    zero12_backward_buckets,
    zero12_held_elements,
)
from runner.memory_model.units import BOOL_BYTES, FP32_BYTES, GB, HALF_BYTES, INT64_BYTES, GiB, to_gb, to_gib

__all__ = [
    "BOOL_BYTES",
    "FP32_BYTES",
    "GB",
    "HALF_BYTES",
    "INT64_BYTES",
    "TRANSIENT_ITEMS",
    "BlockGraph",
    "BlockShape",
    "GiB",
    "ModelStates",
    "activation_items_outside_blocks",
    "activation_items_per_layer",
    "activation_items_total",
    "activations_per_layer",
    "activations_total",
    "after_the_head",
    "at_the_loss",
    "block_graph",
    "bytes_per_param",
    "deepspeed_residuals",
    "korthikanti_activation_items",
    "korthikanti_activations_per_layer",
    "model_block_shape",
    "model_states",
    "offload_host_buffers",
    "to_gb",
    "to_gib",
    "transient_peak",
    "zero12_backward_buckets",
    "zero12_held_elements",
]
