"""Which recompute modes a compiled block takes.

Op-level selective recompute (runner/model/op_recompute.py) chooses, op by op, which outputs a
block keeps: its policy sees the eager ops of the block's forward. A block compiled with
``train.compile=true`` runs as one compiled function whose ops the policy does not see, so it
would keep nothing and rerun the whole block: full recompute under another name. The
attention-core mode and full recompute checkpoint around the compiled code and take it.
"""

from __future__ import annotations

from runner.config import Recompute


def selective_compile_problem() -> str:
    """The one refusal: op-level selective recompute of a compiled block."""
    return (
        "model.activation_checkpointing=selective with train.compile=true: the selective policy "
        "chooses among a block's eager ops, which a compiled block does not run one by one; use "
        "model.activation_checkpointing=full or attention, or train.compile=false"
    )


def recompute_problems(recompute: Recompute, *, compiled: bool) -> list[str]:
    """Why this recompute mode cannot run with ``train.compile`` as set (empty when it can)."""
    return [selective_compile_problem()] if compiled and recompute == Recompute.selective else []


__all__ = ["recompute_problems", "selective_compile_problem"]
