"""The memory a rank holds at the optimizer-step boundary, by term: what the measured ledger
(runner/metrics/ledger.py) is compared with.

:func:`boundary_estimate` is the textbook (runner.memory_model.model_states, ZeRO paper) corrected
by what DeepSpeed 0.19 was measured to hold, each correction a named line, so a reader sees both
the paper's figure and the real one; its model states, device buffers and host lines are the
plan's (runner.memory_model.held_states). :func:`deepspeed_estimate` is the same of a run's rank,
from its config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.config import ModelConfig, OptimizerName, ParallelConfig, Precision
from runner.engine.optimizer_wrapper import OptimizerWrapper, optimizer_wrapper
from runner.memory_model.activations import TRANSIENT_ITEMS, activation_items_total, offloads_block_inputs
from runner.memory_model.case import HeldStates, MemoryCase, RankBatch, case_from_config, held_states, spec_of
from runner.parallel.pipeline_split import stage_blocks


def stage_activations(items: dict[str, int], *, n_layer: int, pp: int) -> list[int]:
    """Bytes each stage saves over one micro-batch, from activation_items_total's whole-model items.

    A stage saves its blocks' share; the first also what the lookup saves (``embedding.*``),
    the last the final norm, the output head's input and the loss (``transient.*`` are not
    saved).
    """
    per_block = items["blocks"] // n_layer
    outside = {k: v for k, v in items.items() if k != "blocks" and k not in TRANSIENT_ITEMS}
    first_only = sum(outside.pop(k) for k in [k for k in outside if k.startswith("embedding.")])
    blocks = stage_blocks(n_layer, pp)
    return [
        n * per_block + (first_only if s == 0 else 0) + (sum(outside.values()) if s == pp - 1 else 0)
        for s, n in enumerate(blocks)
    ]


@dataclass(frozen=True)
class Estimate:
    """Estimated bytes per term, with DeepSpeed's measured departures from the textbook."""

    terms: dict[str, int]
    residual: dict[str, int]
    textbook: dict[str, int]
    host: dict[str, int] = field(default_factory=dict)  # host, per rank: offloaded terms, DeepSpeed buffers


def boundary_estimate(case: MemoryCase) -> Estimate:
    """Per-rank bytes DeepSpeed 0.19 holds at the optimizer-step boundary, by term, plus activations.

    The model states, DeepSpeed's named device buffers and the host lines are the plan's
    (runner.memory_model.held_states, the one source of both); this adds what is held at the
    boundary rather than live at the peak. Departures from the ZeRO paper's accounting, each
    measured on this runner's model:
    - stages 1-2 keep only the gradient partition after the boundary reduce-scatter
      (``averaged_gradients``), so ``grads`` is 2P/dp at stage 1 too; ZeRO-1's full
      gradients exist only inside backward;
    - fp32 training at stages 1-3 steps an fp32 partition that is a second copy of the
      fp32 weights: ``fp32_master_copy`` = 4P/dp;
    - stage 3 keeps parameters of at most ``stage3_param_persistence_threshold`` elements whole
      on every rank (``zero3_full_params``) and allocates its gradient bucket of
      ``reduce_bucket_size`` elements up front (``ipg_buckets``);
    - partitions are padded to a multiple of dp;
    - ZeRO-Offload's own host buffers (runner.memory_model.offload_host_buffers) are named
      lines of ``host`` beside the offloaded terms, and its device staging buffer a
      residual. ``accum_steps`` decides ``accumulated_grads_in_cpu`` (stage 2, only
      with accumulation); None (not known) counts it.

    ``host_is_device`` (CPU ranks): the host lines are in the memory being measured, so
    the offloaded terms are added to the terms and the host buffers to the residuals.

    ``compiled`` (``train.compile``): the blocks' activations as their compiled graphs save
    them (runner.memory_model.block_graph).
    """
    held = held_states(case)
    model, textbook = case.model, held.textbook
    head_dim = model.d_model // model.n_head
    # RoPE's cos and sin tables (runner/model/transformer.py), kept in fp32 under bf16 by DeepSpeed.
    residual: dict[str, int] = {"model_buffers": 2 * 4 * model.max_seq_len * (head_dim // 2)}
    residual.update(held.residuals)
    params, grads, optim = textbook.params, held.grads, textbook.optimizer
    if case.host_is_device:
        # CPU ranks: what ZeRO-Offload moves to the host stays in the memory being measured.
        off = held.offloaded
        params, grads, optim = (
            params + off.get("params", 0),
            grads + off.get("grads", 0),
            optim + off.get("optimizer", 0),
        )
    wrapper = optimizer_wrapper(precision=case.precision, zero_stage=case.spec.zero_stage, pp=case.spec.pp)
    if wrapper is OptimizerWrapper.bf16_optimizer:
        # bf16 at stage 0 under a pipeline is DeepSpeed's BF16_Optimizer: beside the parameters'
        # own bf16 gradients it keeps its flat accumulation buffer, bf16 here (bf16_optimizer.py
        # ``fp32_groups_gradients_flat`` in ``grad_acc_dtype``, listed as ``non_expert_gradients``).
        # Measured: 3,295,744 bytes on tiny's last of 2 stages, its 1,647,872 parameters x 2.
        residual["non_expert_gradients"] = 2 * held.local
    if case.host_is_device:
        residual.update(held.host_buffers)
    return Estimate(
        terms={
            "params": params,
            "grads": grads,
            "optimizer": optim,
            "activations": _saved_activations(case, held),
        },
        residual=residual,
        host={name: nbytes for name, nbytes in held.host.items() if nbytes},
        textbook={
            "params": textbook.params,
            "grads": textbook.grads,
            "optimizer": textbook.optimizer,
        },
    )


def _saved_activations(case: MemoryCase, held: HeldStates) -> int:
    """Bytes autograd saves over one micro-batch on the fullest stage (no transients: what
    :func:`saved_activations` measures)."""
    model = case.model
    offloaded = offloads_block_inputs(
        model, recompute=case.spec.recompute, host_is_device=case.host_is_device
    )
    items = activation_items_total(
        held.block,
        n_layers=model.n_layer,
        vocab_size=model.vocab_size,
        recompute=case.spec.recompute,
        offloaded=offloaded,
    )
    if case.spec.pp > 1:
        return max(stage_activations(items, n_layer=model.n_layer, pp=case.spec.pp))
    return sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)


def deepspeed_estimate(
    *,
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: Precision,
    optimizer: OptimizerName,
    batch: RankBatch,
    host_is_device: bool = False,
    compiled: bool = False,
) -> Estimate:
    """:func:`boundary_estimate` of a run's rank, from its sub-configs and its batch.

    The parameter count is the model's tensors', as the rank holds them
    (runner.parallel.pipeline_split.rank_param_numels).
    """
    case = case_from_config(
        model,
        spec_of(parallel, model.activation_checkpointing),
        batch,
        precision=precision,
        optimizer=optimizer,
        compiled=compiled,
        host_is_device=host_is_device,
    )
    return boundary_estimate(case)


__all__ = ["Estimate", "RankBatch", "boundary_estimate", "deepspeed_estimate", "stage_activations"]
