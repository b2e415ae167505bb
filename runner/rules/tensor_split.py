"""What tensor parallelism splits, and where its group sits.

Megatron-LM's partitioning (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3), as
runner/parallel/tensor.py hands it to DeepSpeed's AutoTP: each rank holds whole heads
(n_head / tp query heads, n_kv_head / tp key/value heads) and ffn_hidden / tp of the MLP's
hidden features; the group all-reduces every block's activations, so it sits inside a node.
"""

from __future__ import annotations

from runner.config import ClusterConfig, ModelConfig

LISTED_DIVISORS_UP_TO = 64  # the fix lists tp degrees up to this many ranks


def tp_split_problems(tp: int, *, n_head: int, n_kv_head: int | None, ffn_hidden: int) -> list[str]:
    """Why ``parallel.tp`` cannot split these heads and MLP width (empty when it can)."""
    if tp == 1:
        return []
    checks = [("model.n_head", n_head, "query heads")]
    if n_kv_head is not None:  # unset: as many as n_head, checked above
        checks.append(("model.n_kv_head", n_kv_head, "key/value heads"))
    checks.append(("model.ffn_hidden", ffn_hidden, "MLP hidden features"))
    return [
        f"parallel.tp={tp} does not divide {key}={value}: each tensor-parallel rank holds "
        f"{value}/{tp} {what}; use parallel.tp in {_divisors_text(value)}"
        for key, value, what in checks
        if value % tp
    ]


def tp_problems(model: ModelConfig, *, tp: int) -> list[str]:
    """Why ``parallel.tp`` cannot split this model (empty when it can): :func:`tp_split_problems`."""
    return tp_split_problems(tp, n_head=model.n_head, n_kv_head=model.n_kv_head, ffn_hidden=model.ffn_hidden)


def _divisors_text(value: int) -> str:
    listed = [d for d in range(1, value + 1) if value % d == 0 and d <= LISTED_DIVISORS_UP_TO]
    return "{" + ", ".join(map(str, listed)) + "}"


def tp_node_problems(tp: int, *, ranks_per_node: int, where: str) -> list[str]:
    """Why a tensor-parallel group of ``tp`` ranks cannot sit inside one node (empty when it can)."""
    if tp <= ranks_per_node:
        return []
    fitting = [d for d in (1, 2, 4, 8, 16, 32) if d <= ranks_per_node]
    # Megatron-LM keeps tensor parallelism inside a node (Narayanan et al. 2021, arXiv
    # 2104.04473, Sec. 3.3): it all-reduces activations twice per block, forward and backward.
    return [
        f"parallel.tp={tp} exceeds {where}: a tensor-parallel group all-reduces every block's "
        f"activations and must sit inside one node; use parallel.tp in "
        f"{{{', '.join(map(str, fitting))}}} and parallel.pp (or more dp) across nodes"
    ]


def tp_cluster_problems(tp: int, cluster: ClusterConfig) -> list[str]:
    """Why a tensor-parallel group cannot sit inside one of the cluster's nodes (empty when it can, or
    when the cluster does not say how many gpus a node has: cluster=local's launcher counts this host)."""
    if cluster.gpus_per_node is None:
        return []
    where = f"cluster={cluster.name} ({cluster.gpus_per_node} gpus per node)"
    return tp_node_problems(tp, ranks_per_node=cluster.gpus_per_node, where=where)


__all__ = ["tp_cluster_problems", "tp_node_problems", "tp_problems", "tp_split_problems"]
