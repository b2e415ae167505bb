"""ZeRO-Offload's stages: the optimizer states from ZeRO stage 1, the parameters at stage 3 and with them.

DeepSpeed offloads only under ZeRO (Ren et al. 2021, arXiv 2101.06840: ZeRO-Offload steps the
optimizer on its partition, stages 1-3); parameters are partitioned, so offloaded, at stage 3
only, and DeepSpeed keeps them on the host beside the optimizer states (ZeRO-Infinity's CPU
layout; runner.config.OffloadPlacement names the two placements it takes).
"""

from __future__ import annotations

from runner.config import Offload, OffloadPlacement, ZeroStage


def offload_pair_problems(offload_optimizer: Offload, offload_param: Offload) -> list[str]:
    """Parameters offloaded without the optimizer states, a placement DeepSpeed does not take."""
    if offload_param == Offload.cpu and offload_optimizer != Offload.cpu:
        return [
            "parallel.offload_param=cpu without parallel.offload_optimizer=cpu: offload the "
            "optimizer states too (DeepSpeed's ZeRO-Infinity order)"
        ]
    return []


def offload_problems(zero_stage: int, offload_optimizer: Offload, offload_param: Offload) -> list[str]:
    """Why this ZeRO stage cannot offload what the two switches ask (empty when it can)."""
    stage = int(zero_stage)
    problems = []
    if offload_optimizer == Offload.cpu and stage < ZeroStage.zero1:
        problems.append(
            f"parallel.offload_optimizer=cpu with parallel.zero_stage={stage}: ZeRO-Offload "
            f"needs stage 1, 2 or 3; use parallel=zero2 or parallel=zero3"
        )
    if offload_param == Offload.cpu and stage != ZeroStage.zero3:
        problems.append(
            f"parallel.offload_param=cpu with parallel.zero_stage={stage}: parameters "
            f"are offloaded at stage 3 only; use parallel=zero3"
        )
    return problems + offload_pair_problems(offload_optimizer, offload_param)


def offload_switches(placement: OffloadPlacement | str) -> tuple[Offload, Offload]:
    """The (parallel.offload_optimizer, parallel.offload_param) switches that make ``placement``."""
    chosen = OffloadPlacement(getattr(placement, "value", placement))
    return (
        Offload.none if chosen == OffloadPlacement.none else Offload.cpu,
        Offload.cpu if chosen == OffloadPlacement.optimizer_and_params else Offload.none,
    )


__all__ = ["offload_pair_problems", "offload_problems", "offload_switches"]
