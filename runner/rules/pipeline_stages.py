"""A pipeline's rules: a block on every stage, and what DeepSpeed's pipeline engine runs.

The first is the split's own (runner/parallel/pipeline_split.py: each stage holds whole
blocks); a plan cannot size a stage without one. The others are DeepSpeed's PipelineEngine's
and this runner's: a plan can size those layouts (it marks them "plan only"), a run cannot
start them.
"""

from __future__ import annotations

from runner.config import Offload, ZeroStage


def pipeline_depth_problems(*, n_layer: int, pp: int) -> list[str]:
    """Why ``parallel.pp`` stages cannot each hold a transformer block (empty when they can)."""
    if pp <= n_layer:
        return []
    return [
        f"parallel.pp={pp} > model.n_layer={n_layer}: each pipeline stage needs at least one "
        f"transformer block; use parallel.pp <= {n_layer}"
    ]


def pipeline_engine_problems(
    *, pp: int, zero_stage: int, offload_optimizer: Offload, offload_param: Offload
) -> list[str]:
    """Why a ``parallel.pp > 1`` layout cannot run here, though it can be planned (empty when it can)."""
    if pp <= 1:
        return []
    stage = int(zero_stage)
    problems = []
    if stage >= ZeroStage.zero2:
        # deepspeed/runtime/pipe/engine.py asserts zero stage < 2 (0.19.8): ZeRO-2 would
        # reduce-scatter gradients inside every micro-batch's backward, the pipeline's own
        # gradient reduction runs once per step.
        problems.append(
            f"parallel.pp={pp} with parallel.zero_stage={stage}: DeepSpeed's pipeline engine "
            f"refuses ZeRO-2 and ZeRO-3 (gradients cannot be partitioned across its micro-batches); "
            f"use parallel=pp2 or parallel=zero1 parallel.pp={pp}"
        )
    if Offload.cpu in (offload_optimizer, offload_param):
        problems.append(
            f"parallel.pp={pp} with CPU offload: offload under a pipeline is not run here; drop "
            f"parallel.offload_optimizer / parallel.offload_param or use parallel.pp=1"
        )
    return problems


__all__ = ["pipeline_depth_problems", "pipeline_engine_problems"]
