"""The pipeline's stage split by arithmetic: which layers and parameters each stage holds.

runner/parallel/pipeline.py builds the stages; this module only counts, without torch, so the
launching process and ``plan=true`` can size a pipeline in a fraction of a second.

The split is DeepSpeed's ``partition_method="type:BlockPipe"``: ``partition_balanced``
(deepspeed/runtime/utils.py, a linear-partition dynamic programme) over the layer list
with weight 1 for each block and 0 for the embedding, the final norm and the output head.
For those weights it puts ceil(L / pp) blocks on the first L mod pp stages and
floor(L / pp) on the others, the embedding on the first stage and the norm and head on
the last; tests/unit/runner/parallel/test_pipeline.py checks this against DeepSpeed's own function,
and runner/parallel/pipeline.py checks every built pipeline against it.
"""

from __future__ import annotations

import itertools

from runner.config import ModelConfig
from runner.model.shape import embedding_numels, layer_param_numels, param_numels
from runner.rules import pipeline_depth_problems


def stage_blocks(n_layer: int, pp: int) -> list[int]:
    """Transformer blocks on each stage: ceil(L / pp) on the first L mod pp stages, floor after."""
    if pp < 1:
        raise ValueError(f"pp={pp}: a pipeline has at least one stage")
    if problems := pipeline_depth_problems(n_layer=n_layer, pp=pp):
        raise ValueError("; ".join(problems))
    fewer, extra = divmod(n_layer, pp)
    return [fewer + (1 if stage < extra else 0) for stage in range(pp)]


def stage_bounds(n_layer: int, pp: int) -> list[tuple[int, int]]:
    """[start, stop) of each stage over the layer list (0 embedding, 1..L blocks, L+1 norm, L+2 output)."""
    blocks = stage_blocks(n_layer, pp)
    starts = [0, *(1 + sum(blocks[:stage]) for stage in range(1, pp))]
    return list(itertools.pairwise([*starts, n_layer + 3]))


def stage_param_numels(model: ModelConfig, pp: int, tp: int = 1) -> list[list[int]]:
    """Numel of every parameter tensor each stage holds, in module order (a tied embedding
    counts on both ends: the lookup on the first stage, the output head on the last)."""
    lookup, head = embedding_numels(model, tp)
    per_block = layer_param_numels(model, tp)
    stages = []
    for stage, blocks in enumerate(stage_blocks(model.n_layer, pp)):
        numels = [lookup] if stage == 0 else []
        numels += per_block * blocks
        if stage == pp - 1:
            numels += [model.d_model, head]  # final norm; the output head (the tied copy, or its own)
        stages.append(numels)
    return stages


def rank_param_numels(model: ModelConfig, *, tp: int = 1, pp: int = 1) -> list[int]:
    """Numel of every parameter tensor the fullest rank holds before ZeRO partitions them:
    the whole model's (1/tp of each block matrix) or, under a pipeline, the stage holding most."""
    if pp == 1:
        return param_numels(model, tp=tp)
    return max(stage_param_numels(model, pp, tp=tp), key=sum)


__all__ = ["rank_param_numels", "stage_blocks", "stage_bounds", "stage_param_numels"]
