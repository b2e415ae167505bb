"""What sequence parallelism splits, and what it composes with.

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509, Sec. 3; DeepSpeed's
deepspeed/sequence/layer.py ``DistributedAttention``), as runner/parallel/sequence.py runs it:
each rank of a group of ``sp`` holds ``seq_len / sp`` tokens of every sample; around attention an
all-to-all trades the sequence for the heads, so each rank attends over the whole sequence with
``n_head / sp`` query heads and ``n_kv_head / sp`` key/value heads. So sp divides the sequence and
both head counts.

It composes with ZeRO 0-3 and ZeRO-Offload: DeepSpeed reduces the gradients over the sequence and
data-parallel ranks together (its ``mpu`` from deepspeed/runtime/sequence_parallel/
parallel_state_sp.py, as ALST passes it). Not with tensor or pipeline parallelism: that ``mpu``
knows the sequence and data groups only, and DeepSpeed's AutoTP and pipeline engine each build
groups of their own over the same ranks (ALST, arXiv 2506.13996, runs Ulysses with ZeRO alone).
"""

from __future__ import annotations

from runner.config import ModelConfig

LISTED_DIVISORS_UP_TO = 64  # the fix lists sp degrees up to this many ranks


def _divisors_text(values: list[int]) -> str:
    common = [d for d in range(1, LISTED_DIVISORS_UP_TO + 1) if all(v % d == 0 for v in values)]
    return "{" + ", ".join(map(str, common)) + "}"


def sp_split_problems(sp: int, *, n_head: int, n_kv_head: int | None, seq_len: int | None) -> list[str]:
    """Why ``parallel.sp`` cannot split these heads and this sequence (empty when it can;
    ``seq_len=None``: the sequence is not known here)."""
    if sp == 1:
        return []
    checks = [("model.n_head", n_head, "query heads")]
    if n_kv_head is not None:  # unset: as many as n_head, checked above
        checks.append(("model.n_kv_head", n_kv_head, "key/value heads"))
    if seq_len is not None:
        checks.append(("data.seq_len", seq_len, "tokens of each sample"))
    values = [value for _, value, _ in checks]
    return [
        f"parallel.sp={sp} does not divide {key}={value}: each sequence-parallel rank holds "
        f"{value}/{sp} {what}; use parallel.sp in {_divisors_text(values)}"
        for key, value, what in checks
        if value % sp
    ]


def sp_compose_problems(sp: int, *, tp: int, pp: int) -> list[str]:
    """Why ``parallel.sp`` cannot run beside these tensor and pipeline degrees (empty when it can)."""
    if sp == 1 or (tp == 1 and pp == 1):
        return []
    return [
        f"parallel.sp={sp} with parallel.tp={tp} and parallel.pp={pp}: sequence parallelism runs "
        "beside ZeRO only (DeepSpeed's sequence groups and its tensor or pipeline groups are built "
        "apart over the same ranks); set parallel.tp=1 parallel.pp=1 and shard with "
        "parallel.zero_stage, or set parallel.sp=1"
    ]


def sp_problems(model: ModelConfig, *, sp: int, tp: int, pp: int, seq_len: int | None = None) -> list[str]:
    """Why ``parallel.sp`` cannot split this model and sequence, or run beside tp and pp."""
    return [
        *sp_compose_problems(sp, tp=tp, pp=pp),
        *sp_split_problems(sp, n_head=model.n_head, n_kv_head=model.n_kv_head, seq_len=seq_len),
    ]


__all__ = ["sp_compose_problems", "sp_problems", "sp_split_problems"]
