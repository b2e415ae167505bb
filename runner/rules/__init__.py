"""Layout and config rules, each written once: a function that returns its problems, each naming
the key, the value and the fix (an empty list when the values are allowed).

Every place that needs a rule asks its function here:

- the refusal before launch and before ``plan=true`` (runner/preflight/validate.py);
- the planner (runner/plan/planner.py): ``check_knobs`` refuses what no plan can size
  (:func:`layout_problems`; of a run's config ``knobs_from_config`` asks
  :func:`config_layout_problems`, the cluster's node size included), ``plan_only_reasons`` marks
  what a plan sizes but the runner does not run (:func:`pipeline_engine_problems`), and the
  ladder (runner/plan/ladder.py) tries only the tp and pp degrees these allow;
- the estimators' own checks (runner/memory_model/, runner/model/shape.py,
  runner/parallel/pipeline_split.py), which raise ValueError in the same words.

Modules: head_layout.py (heads and head size), loss_tiles.py (the pieces the loss runs in),
mlp_tiles.py (the pieces each block's MLP runs in), recompute.py (the modes a compiled block
takes), tensor_split.py (what tp splits, a group inside a node), sequence_split.py (what sp splits,
and what it runs beside), offload_stages.py (the ZeRO stages ZeRO-Offload takes),
pipeline_stages.py (a block per stage; what DeepSpeed's pipeline engine runs),
activation_offload.py (the runs whose checkpointed inputs go to the host).
"""

from __future__ import annotations

from runner.config import ModelConfig, Offload, ParallelSpec, TrainConfig, ZeroStage
from runner.rules.activation_offload import activation_offload_problems
from runner.rules.head_layout import head_problems
from runner.rules.loss_tiles import loss_tile_count, loss_tile_length_problems, loss_tile_problems
from runner.rules.mlp_tiles import mlp_tile_compile_problem, mlp_tile_count, mlp_tile_problems
from runner.rules.offload_stages import offload_pair_problems, offload_problems, offload_switches
from runner.rules.pipeline_stages import pipeline_depth_problems, pipeline_engine_problems
from runner.rules.recompute import recompute_problems, selective_compile_problem
from runner.rules.sequence_split import sp_compose_problems, sp_problems, sp_split_problems
from runner.rules.tensor_split import tp_cluster_problems, tp_node_problems, tp_problems, tp_split_problems


def _problems(
    model: ModelConfig,
    spec: ParallelSpec,
    *,
    offload_pair: tuple[Offload, Offload],
    seq_len: int | None,
) -> list[str]:
    """The rules of :func:`layout_problems`, ZeRO-Offload's asked of the configured pair."""
    return [
        *offload_problems(spec.zero_stage, *offload_pair),
        *tp_problems(model, tp=spec.tp),
        *sp_problems(model, sp=spec.sp, tp=spec.tp, pp=spec.pp, seq_len=seq_len),
        *pipeline_depth_problems(n_layer=model.n_layer, pp=spec.pp),
        *loss_tile_problems(model, tp=spec.tp, pp=spec.pp),
        *activation_offload_problems(model, recompute=spec.recompute, pp=spec.pp),
    ]


def layout_problems(model: ModelConfig, spec: ParallelSpec, *, seq_len: int | None = None) -> list[str]:
    """What neither a plan nor a run can take, in one order: ZeRO-Offload's stage, tp's split of
    the model, sp's split of the heads and the sequence (``seq_len``, where known) and what it runs
    beside, a block on every pipeline stage, the loss's pieces, the activations' offload."""
    return _problems(model, spec, offload_pair=offload_switches(spec.offload), seq_len=seq_len)


def config_layout_problems(config: TrainConfig) -> list[str]:
    """:func:`layout_problems` of a run's config (ZeRO-Offload's rule asked of the configured pair,
    which may offload the parameters alone), then its tensor-parallel group against the cluster's
    node (where the cluster gives its gpus per node), then the loss's and the MLP's pieces against
    the sequence."""
    par = config.parallel
    spec = ParallelSpec(
        zero_stage=ZeroStage(par.zero_stage),
        tp=par.tp,
        pp=par.pp,
        sp=par.sp,
        recompute=config.model.activation_checkpointing,
    )
    return [
        *_problems(
            config.model,
            spec,
            offload_pair=(par.offload_optimizer, par.offload_param),
            seq_len=config.data.seq_len,
        ),
        *tp_cluster_problems(par.tp, config.cluster),
        *loss_tile_length_problems(config.model, seq_len=config.data.seq_len),
        *mlp_tile_problems(config.model, seq_len=config.data.seq_len, compiled=config.train.compile),
        *recompute_problems(config.model.activation_checkpointing, compiled=config.train.compile),
    ]


__all__ = [
    "activation_offload_problems",
    "config_layout_problems",
    "head_problems",
    "layout_problems",
    "loss_tile_count",
    "loss_tile_length_problems",
    "loss_tile_problems",
    "mlp_tile_compile_problem",
    "mlp_tile_count",
    "mlp_tile_problems",
    "offload_pair_problems",
    "offload_problems",
    "offload_switches",
    "pipeline_depth_problems",
    "pipeline_engine_problems",
    "recompute_problems",
    "selective_compile_problem",
    "sp_compose_problems",
    "sp_problems",
    "sp_split_problems",
    "tp_cluster_problems",
    "tp_node_problems",
    "tp_problems",
    "tp_split_problems",
]
