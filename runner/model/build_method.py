"""How a layout builds its model, from the knobs alone: runner/engine/build.py builds it, plan_host.py sizes
it.

Every way gives the same initial weights for a seed (runner/model/transformer.py ``initial_values``).
"""

from __future__ import annotations

from runner.config import ZeroStage

WHOLE = "whole"  # ZeRO-0/1/2 keep the parameters whole anyway
# ZeRO-0/1/2 with tp: runner/parallel/shard_build.py, cut on meta before allocating
SHARD = "as its tensor-parallel shard"
PARTITIONED = (
    "partitioned by zero.Init"  # runner/engine/zero_init.py: never whole on a rank (AutoTP cuts after)
)
BY_STAGE = "by pipeline stage"  # runner/parallel/pipeline.py: each rank builds its stage only

# Initial values are drawn on the host in fp32 and written into the parameters this many
# elements at a time (runner/model/transformer.py ``write_initial_values``): 64 of its 2^20-element
# chunks, 256 MB, so a rank's threads draw in parallel while the host never holds a large
# parameter whole in fp32 (Llama-2 70B's embedding: 262M elements, 1.05 GB).
DRAW_BLOCK = 64 << 20


def build_method_for(*, zero_stage: ZeroStage | int, tp: int, pp: int) -> str:
    """``BY_STAGE`` with a pipeline, ``PARTITIONED`` at ZeRO-3 (with or without tp), ``SHARD``
    with tp at ZeRO 0-2, else ``WHOLE``. All but ZeRO-3 allocate on the rank's device."""
    if pp > 1:
        return BY_STAGE
    if ZeroStage(zero_stage).shards_parameters:
        return PARTITIONED
    if tp > 1:
        return SHARD
    return WHOLE
