"""Pipeline parallelism: ladder's decoder cut into DeepSpeed ``PipelineModule`` stages.

The model is the same as runner/model/transformer.py's, written as a flat list of layers
(embedding, ``n_layer`` blocks, final norm, output head) that DeepSpeed splits into
``pp`` stages, one per rank of a pipeline; each rank builds and holds only its stage.

Schedule. ``PipelineEngine.train_batch`` runs one optimizer step: the batch contract's
``accum_steps`` micro-batches are the pipeline's micro-batches (GPipe, Huang et al.
2019, arXiv 1811.06965), scheduled one-forward-one-backward (PipeDream-Flush / 1F1B,
Narayanan et al. 2021, arXiv 2104.04473, Sec. 2.2.1), and flushed before the optimizer
step, so the step is the same synchronous step as without a pipeline. Idle time (the
bubble) is (pp - 1) / accum_steps of the ideal step time (same paper and section).

Data. Every stage of a pipeline reads the same micro-batches of its data-parallel rank,
in the order of runner/data/batches.py's contract: DeepSpeed feeds the inputs on the first stage
and the labels on the last, so the sequences of a step do not depend on the layout.

Weights. A tied embedding (``tie_embeddings``) lives on the first stage (lookup) and the
last (output head) as DeepSpeed's ``TiedLayerSpec``: DeepSpeed sums the two stages'
gradients before the step, so the copies stay one parameter. Each rank builds its stage's
layers only and draws their values by name (runner/model/transformer.py's ``write_initial_values``): the
same weights for a seed as every other layout.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from runner.config import ModelConfig, Precision, Recompute
from runner.data.batches import BatchSource, rank_slice
from runner.layout import Layout
from runner.metrics.ledger import Ledger, fullest_device, measure_model_states, saved_activations
from runner.metrics.phase_clock import PhaseClock
from runner.model.transformer import (
    RMSNorm,
    TransformerBlock,
    lm_loss,
    rope_cache,
)
from runner.parallel.pipeline_names import EMBED_KEY, model_name
from runner.parallel.pipeline_split import stage_blocks, stage_bounds
from runner.parallel.pipeline_tensor import cut_pipeline_module, output_head
from runner.parallel.shard_build import write_initial_weights
from runner.parallel.tensor import grid_grad_norm
from runner.train.nonfinite import NonFiniteGuard, skipping

log = logging.getLogger("ladder")


# --------------------------------------------------------------------------------------
# The layers
# --------------------------------------------------------------------------------------


class RotaryTables(nn.Module):
    """RoPE's cos/sin tables, one instance shared by every block of a stage (runner/model/transformer.py)."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cos, sin = rope_cache(cfg.d_model // cfg.n_head, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)


class EmbeddingPipe(nn.Embedding):
    """Token lookup, first stage: tokens (B, T) -> (B, T, C)."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        # An empty weight skips nn.Embedding's normal_ init, which _init_stage overwrites:
        # as runner/model/transformer.py's Transformer, whose note says what it costs on the meta device.
        super().__init__(vocab_size, d_model, _weight=torch.empty(vocab_size, d_model))


class OutputPipe(nn.Linear):
    """The untied output head (bias-free), last stage: (B, T, C) -> (B, T, V)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__(d_model, vocab_size, bias=False)


class BlockPipe(nn.Module):
    """One TransformerBlock as a pipeline layer: x (B, T, C) -> (B, T, C), RoPE from the stage's tables."""

    def __init__(self, cfg: ModelConfig, rope: RotaryTables) -> None:
        super().__init__()
        self.block = TransformerBlock(cfg)
        self.rope = rope  # shared: registered once per stage, counted once (remove_duplicate)
        self.full_recompute = cfg.activation_checkpointing == Recompute.full

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As one iteration of Transformer.forward's block loop, full recompute included."""
        T = x.shape[1]
        cos, sin = self.rope.cos[:T], self.rope.sin[:T]
        if self.full_recompute and self.training:
            return checkpoint(self.block, x, cos, sin, use_reentrant=False)
        return self.block(x, cos, sin)


def _layer_specs(cfg: ModelConfig) -> list[Any]:
    """Embedding, blocks, final norm and output head as DeepSpeed layer specs."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    rope = RotaryTables(cfg)
    if cfg.tie_embeddings:
        first = TiedLayerSpec(EMBED_KEY, EmbeddingPipe, cfg.vocab_size, cfg.d_model)
        head = TiedLayerSpec(EMBED_KEY, EmbeddingPipe, cfg.vocab_size, cfg.d_model, forward_fn=output_head)
    else:
        first = LayerSpec(EmbeddingPipe, cfg.vocab_size, cfg.d_model)
        head = LayerSpec(OutputPipe, cfg.d_model, cfg.vocab_size)
    blocks = [LayerSpec(BlockPipe, cfg, rope) for _ in range(cfg.n_layer)]
    return [first, *blocks, LayerSpec(RMSNorm, cfg.d_model, cfg.norm_eps), head]


def _init_stage(pipe: Any, cfg: ModelConfig, seed: int) -> None:
    """Give this stage's parameters the values runner/model/transformer.py draws for them by name
    (a tensor-parallel shard: its slice of the whole weight's)."""

    write_initial_weights(pipe, cfg, seed=seed, name_of=lambda name: model_name(cfg, name))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default floating dtype is ``dtype`` inside, and what it was after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_pipeline(
    cfg: ModelConfig,
    *,
    pp: int,
    seed: int,
    tp: int = 1,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """This rank's stage of ``cfg`` as a PipelineModule (the process group must exist).

    The stage's layers are allocated on ``device`` (default: the host) in ``dtype``, as
    runner/model/transformer.py ``build_model`` builds a whole model: DeepSpeed's LayerSpec builds each
    layer with torch's defaults, so the two are set while it does. The RoPE tables are made
    before, in fp32. With ``tp`` > 1 the stage is then split over its tensor-parallel group
    (runner/parallel/pipeline_tensor.py).
    """
    import torch.distributed as dist
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    layers = _layer_specs(cfg)
    # Without tp, DeepSpeed's default grid (pipe, data); with it, (pipe, data, model).
    grid: dict[str, Any] = {"num_stages": pp}
    if tp > 1:
        dp = dist.get_world_size() // (pp * tp)
        grid = {"topology": PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)}
    # PipelineModule broadcasts the tied embedding from the first stage to the last in place
    # (``_synchronize_tied_weights``). Outside no_grad autograd records that broadcast on the
    # weight, and every backward then warns that c10d::broadcast_ has no autograd kernel.
    kwargs: dict[str, Any] = dict(
        layers=layers, loss_fn=lm_loss, partition_method=f"type:{BlockPipe.__name__}", **grid
    )
    with torch.no_grad(), torch.device(device or "cpu"), _default_dtype(dtype):
        if tp > 1:
            pipe = cut_pipeline_module(
                torch.device(device or "cpu"), embedding_type=EmbeddingPipe, head_type=OutputPipe, **kwargs
            )
        else:
            pipe = PipelineModule(**kwargs)
    if list(pipe.parts) != [b[0] for b in stage_bounds(cfg.n_layer, pp)] + [cfg.n_layer + 3]:
        raise RuntimeError(f"DeepSpeed split the layers as {pipe.parts}, not as stage_bounds says")
    _init_stage(pipe, cfg, seed)
    return pipe


# --------------------------------------------------------------------------------------
# Fixes to DeepSpeed 0.19's pipeline engine
# --------------------------------------------------------------------------------------


def _clip_across_stages(engine: Any, max_norm: float) -> None:
    """fp32 ZeRO-0 clipping by the norm of the whole model's gradient, all stages together.

    DeepSpeed 0.19 clips fp32 ZeRO-0 gradients with runtime/utils.py ``clip_grad_norm_``,
    whose Megatron rule counts a non-model-parallel parameter on model-parallel rank 0
    only; the pipeline grid's model-parallel group spans the stages, so only the first
    stage's gradients enter the norm. Here each stage adds its own squared norm over the
    pipeline group, after the data-parallel all-reduce, as the plain layout sees it
    (runner/parallel/tensor.py ``grid_grad_norm``, tensor-parallel shards included).
    """

    def clip() -> None:
        params = [p for p in engine.module.parameters() if p.grad is not None]
        norm = grid_grad_norm(params, engine.grid)
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # as clip_grad_norm_ does
        for param in params:
            param.grad.mul_(coef)
        engine._global_grad_norm = float(norm)

    engine.clip_fp32_gradients = clip


# --------------------------------------------------------------------------------------
# One optimizer step
# --------------------------------------------------------------------------------------


# DeepSpeed's pipeline instructions (deepspeed/runtime/pipe/schedule.py) by the step phase
# their time counts in (runner/metrics/phase_clock.py). The data-parallel and tied-weight gradient
# reductions count in backward, as ZeRO's reductions do in the plain loop.
_INSTRUCTION_PHASES = {
    "LoadMicroBatch": "data",
    "ForwardPass": "forward",
    "BackwardPass": "backward",
    "ReduceGrads": "backward",
    "ReduceTiedGrads": "backward",
    "OptimizerStep": "optimizer",
    "SendActivation": "p2p",
    "RecvActivation": "p2p",
    "SendGrad": "p2p",
    "RecvGrad": "p2p",
}


class PipelineSteps:
    """Runs optimizer steps through DeepSpeed's PipelineEngine and measures what the loop cannot see."""

    def __init__(
        self,
        engine: Any,
        batches: BatchSource,
        *,
        layout: Layout,
        precision: Precision,
        grad_clip: float,
        nonfinite: NonFiniteGuard,
        nan_steps: frozenset[int] = frozenset(),
    ) -> None:
        self.engine = engine
        self.batches = batches
        self.layout = layout
        self.precision = precision
        # The pipeline's data-parallel rank, from DeepSpeed's topology (pipe-major rank order).
        self.dp_rank = int(engine.grid.get_data_parallel_id())
        self.stage = int(engine.stage_id)
        self._boundary: Callable[[], None] | None = None
        self._states: Ledger | None = None
        self._saved_bytes = 0
        self._nonfinite = nonfinite
        self._step = 0
        self._skip = False  # this step's update was skipped (train.on_nonfinite=skip)
        if nan_steps and engine.is_last_stage():
            self._inject_nan(nan_steps)
        if not engine.zero_optimization() and precision == Precision.fp32 and grad_clip > 0:
            _clip_across_stages(engine, grad_clip)
        # The optimizer step runs inside train_batch; model states are measured just before
        # it, at the accumulation boundary, as the plain loop does.
        take_model_step = engine._take_model_step

        def at_boundary(*args: Any, **kwargs: Any) -> Any:
            if self._boundary is not None:
                self._boundary()
            # Decided before the update, the same on every rank (runner/train/nonfinite.py): a
            # non-finite loss stops the run here or skips this step's update.
            self._skip = self._nonfinite.should_skip(self._mean_loss(), step=self._step)
            if not self._skip:
                return take_model_step(*args, **kwargs)
            with skipping(engine):
                return take_model_step(*args, **kwargs)

        engine._take_model_step = at_boundary

    def _mean_loss(self) -> float:
        """The step's loss, averaged over its micro-batches and the pipelines, on every rank.

        Only a last stage has it (DeepSpeed's ``total_loss``, summed over the micro-batches)
        before the step: one all-reduce over all ranks sums the last stages' losses and counts
        them.
        """
        engine = self.engine
        local = torch.zeros(2, dtype=torch.float64, device=engine.device)
        if engine.is_last_stage():
            local[0] = engine.total_loss.detach().double() / self.layout.accum_steps
            local[1] = 1.0
        torch.distributed.all_reduce(local)
        return float(local[0] / local[1])

    def _inject_nan(self, steps: frozenset[int]) -> None:
        """LADDER_INJECT_NAN on a last stage: its loss is NaN at ``steps`` (tests of train.on_nonfinite)."""
        module = self.engine.module
        loss_fn = module.loss_fn

        def loss_at_step(*args: Any) -> Any:
            loss = loss_fn(*args)
            return loss * float("nan") if self._step in steps else loss

        module.loss_fn = loss_at_step

    def time_phases(self, clock: PhaseClock) -> None:
        """Mark ``clock`` around each instruction the engine runs, under the instruction's phase.

        ``PipelineEngine._exec_schedule`` looks every instruction up in ``self._INSTRUCTION_MAP``
        (DeepSpeed 0.19.8); an instance attribute of the same name takes the class's place.
        """

        def timed(run: Callable[..., Any], phase: str) -> Callable[..., Any]:
            def run_timed(engine: Any, **kwargs: Any) -> Any:
                clock.mark("other")  # the engine's own work since the last instruction
                result = run(engine, **kwargs)
                clock.mark(phase)
                return result

            return run_timed

        self.engine._INSTRUCTION_MAP = {
            kind: timed(run, _INSTRUCTION_PHASES.get(kind.__name__, "other"))
            for kind, run in type(self.engine)._INSTRUCTION_MAP.items()
        }

    def after_each_backward(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once each micro-batch's backward pass has run on this stage."""
        instructions = dict(getattr(self.engine, "_INSTRUCTION_MAP", type(self.engine)._INSTRUCTION_MAP))
        for kind, run in instructions.items():
            if kind.__name__ == "BackwardPass":

                def backward_then(engine: Any, _run: Callable[..., Any] = run, **kwargs: Any) -> Any:
                    result = _run(engine, **kwargs)
                    callback()
                    return result

                instructions[kind] = backward_then
        self.engine._INSTRUCTION_MAP = instructions

    def _micro_batches(
        self, step: int, source: BatchSource | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This step's micro-batches of this pipeline's dp rank: the sequences every layout sees."""
        lay = self.layout
        source = self.batches if source is None else source
        for micro in range(lay.accum_steps):
            start = rank_slice(self.dp_rank, micro, lay.micro_size, lay.accum_steps)
            inputs, targets = source.micro_batch(step, start, lay.micro_size)
            yield inputs.to(self.engine.device), targets.to(self.engine.device)

    def eval_loss(self, held_out: BatchSource, *, batches: int) -> float:
        """The mean held-out loss over ``batches`` global batches (runner/train/evaluation.py), on every
        rank: DeepSpeed's ``eval_batch`` averages each over its micro-batches and the pipelines
        and broadcasts it from the last stage."""
        total = 0.0
        for batch in range(batches):
            total += float(self.engine.eval_batch(data_iter=self._micro_batches(batch, held_out)))
        return total / batches

    def _measure_first_micro_batch(self) -> None:
        """Count the tensors this stage saves for backward over its first forward (and loss)."""
        module = self.engine.module
        forward, loss_fn = module.forward, module.loss_fn

        def measured(call: Callable[..., Any], restore: Callable[[], None]) -> Callable[..., Any]:
            def once(*args: Any) -> Any:
                restore()
                with saved_activations(module) as saved:
                    out = call(*args)
                self._saved_bytes += saved["activations"]
                return out

            return once

        def restore_forward() -> None:
            module.forward = forward

        def restore_loss() -> None:
            module.loss_fn = loss_fn

        module.forward = measured(forward, restore_forward)
        if module.loss_fn is not None and self.engine.is_last_stage():
            module.loss_fn = measured(loss_fn, restore_loss)

    def train_step(self, step: int, *, measure_states: bool, measure_activations: bool) -> tuple[float, bool]:
        """One optimizer step: the loss (the mean over the global batch, on every rank) and whether
        its update was skipped for a non-finite loss."""
        self._step = step
        self._skip = False
        if measure_activations:
            self._measure_first_micro_batch()
        if measure_states:

            def measure() -> None:
                self._states = measure_model_states(self.engine, precision=self.precision)

            self._boundary = measure
        try:
            loss = self.engine.train_batch(data_iter=self._micro_batches(step))
        finally:
            self._boundary = None
        # DeepSpeed averages the last stage's micro-batch losses over dp and broadcasts them.
        return float(loss), self._skip

    def ledger(self) -> Ledger | None:
        """The measured ledger, each term at its most over ranks (every rank must call this)."""
        if self._states is None:
            return None
        self._states.terms["activations"] = self._saved_bytes
        return fullest_device(self._states)

    def summary(self, *, step_s: float | None, p2p_s: float | None) -> dict[str, Any]:
        """What summary.json keeps about the pipeline: split, schedule, bubble predicted and measured.

        The bubble is (pp - 1) / accum of the ideal step (Narayanan et al. 2021, Sec. 2.2.1),
        so b / (1 + b) of the step as run. Measured: the share of the step rank 0 spent in
        stage-to-stage sends and receives (``time/p2p_s``), the wait for its neighbour stage
        plus the transfers themselves.
        """
        lay = self.layout
        bubble = (lay.pp - 1) / lay.accum_steps
        timed = step_s is not None and math.isfinite(step_s) and step_s > 0
        p2p_share = p2p_s / step_s if timed and p2p_s is not None and step_s else None
        bounds = self.engine.module.parts
        return {
            "stages": lay.pp,
            "layers_per_stage": [int(b - a) for a, b in itertools.pairwise(bounds)],
            "blocks_per_stage": stage_blocks(int(bounds[-1]) - 3, lay.pp),
            "schedule": "1F1B (PipeDream-Flush, Narayanan et al. 2021), flushed every step",
            "micro_batches": lay.accum_steps,
            "bubble_fraction_predicted": bubble,
            "bubble_share_of_step_predicted": bubble / (1 + bubble),
            "p2p_share_of_step_measured": p2p_share,
            "measured_step_s": step_s if timed else None,
        }
