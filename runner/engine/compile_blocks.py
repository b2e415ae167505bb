"""``train.compile=true``: compile each transformer block with ``torch.compile``.

Regional compilation, as torchtitan does it (``apply_compile`` in its Llama parallelize
step): every block is compiled on its own with ``nn.Module.compile``, which keeps the
module tree and the parameter names, so checkpoints, ZeRO's hooks, the pipeline's layer
split and AutoTP see the same model as without it. The blocks share their code, so torch
compiles one graph and reuses it for every block (``inline_inbuilt_nn_modules``, torch's
default since 2.5). The embeddings, final norm and head stay eager.

The first step also pays the compile time (tens of seconds); the step-time metrics show
it, and the later steps show what compiling bought. Where something inside a block cannot
be traced, torch breaks the block's graph there and runs that part eagerly: ZeRO-3's
parameter gather before every linear layer, the collectives of tensor-parallel layers.
``summary.json``'s ``compile`` counts those breaks and names the most frequent reasons.
"""

from __future__ import annotations

from collections import Counter

import torch

from runner.model.transformer import TransformerBlock
from runner.rundir.summary_records import CompileRecord

_REASONS_KEPT = 3


def compile_blocks(model: torch.nn.Module) -> int:
    """Compile every ``TransformerBlock`` in ``model`` in place; the number compiled."""
    blocks = [module for module in model.modules() if isinstance(module, TransformerBlock)]
    for block in blocks:
        block.compile()
    return len(blocks)


def compile_summary(blocks: int) -> CompileRecord:
    """``summary.json``'s ``compile``: the blocks compiled and the graph breaks torch took."""
    # Deferred: torch._dynamo loads only in a compiled run (1.6 s of start-up otherwise).
    from torch._dynamo.utils import counters

    by_reason: Counter[str] = Counter()
    for reason, count in counters["graph_break"].items():
        by_reason[reason.splitlines()[0][:200]] += count  # torch's first line names the cause
    commonest = by_reason.most_common(_REASONS_KEPT)
    return {
        "blocks": blocks,
        "graph_breaks": sum(by_reason.values()),
        "top_break_reasons": [f"{count} x {reason}" for reason, count in commonest],
    }
