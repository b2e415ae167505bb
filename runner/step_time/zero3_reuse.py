"""Which of ZeRO-3's gathered parameters are gathered again in backward.

DeepSpeed 0.19.8 releases a gathered parameter after its module's forward unless it will be
used again soon: runtime/zero/partitioned_param_coordinator.py ``__params_to_release`` walks the
modules the traced step runs next and keeps every parameter it meets before it has walked
``stage3_max_reuse_distance`` elements (runtime/zero/config.py ``max_reuse_distance``, 1e9 by
default; the runner leaves it). A parameter's next use after its forward is its backward (or,
with recompute, the forward run again just before it), after every later module's forward and
backward: so a tensor is kept, and not gathered again, when twice the elements of the modules
after it fall under the distance. A tied embedding's next use is the output head, after one
pass over the blocks. gpt2_124m (124M elements) keeps every parameter between forward and
backward, llama_1b its tied embedding and the last 8 of its 16 blocks (38% of its elements are
gathered again), llama_7b its output head and its last 2 blocks or so (93% gathered again).

Each micro-batch ends with every gathered parameter released: the next gathers them again.
"""

from __future__ import annotations

from runner.engine.deepspeed_config import persistence_threshold_elements
from runner.layout import Layout
from runner.parallel.pipeline_split import rank_param_numels
from runner.step_time.workload import Knobs, Workload

MAX_REUSE_DISTANCE = 10**9  # DeepSpeed's stage3_max_reuse_distance default (runtime/zero/config.py)


def regathered(numels: list[int], threshold: int, *, tied: bool) -> tuple[int, int]:
    """(elements, tensors) of the gathered parameters (above ``threshold``) that backward gathers
    again, of a rank's tensors ``numels`` in module order (the embedding first)."""
    elements = tensors = 0
    after = sum(numels)
    for index, numel in enumerate(numels):
        after -= numel
        reuse = after if (tied and index == 0) else 2 * after
        if numel > threshold and reuse >= MAX_REUSE_DISTANCE:
            elements += numel
            tensors += 1
    return elements, tensors


def layout_regathered(workload: Workload, knobs: Knobs, layout: Layout) -> tuple[int, int]:
    """:func:`regathered` of the layout's fullest rank; (0, 0) below ZeRO-3."""
    if not knobs.spec.zero_stage.shards_parameters:
        return 0, 0
    threshold = persistence_threshold_elements(knobs.spec.param_persistence_threshold, workload.model)
    numels = rank_param_numels(workload.model, tp=layout.tp, pp=layout.pp)
    return regathered(numels, threshold, tied=workload.model.tie_embeddings)


__all__ = ["MAX_REUSE_DISTANCE", "layout_regathered", "regathered"]
