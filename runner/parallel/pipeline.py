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
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runner.config import ModelConfig
from runner.model.transformer import (
    RMSNorm,
    TransformerBlock,
    checkpointed_block,
    lm_loss,
    rope_cache,
)
from runner.parallel.pipeline_names import EMBED_KEY, model_name
from runner.parallel.pipeline_split import stage_bounds
from runner.parallel.pipeline_tensor import cut_pipeline_module, output_head
from runner.parallel.shard_build import write_initial_weights

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
        cos, sin = rope_cache(cfg, cfg.max_seq_len)
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
        self.recompute = cfg.activation_checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As one iteration of Transformer.forward's block loop, recompute included."""
        T = x.shape[1]
        cos, sin = self.rope.cos[:T], self.rope.sin[:T]
        return checkpointed_block(self.block, x, cos, sin, self.recompute, training=self.training)


def _layer_specs(cfg: ModelConfig) -> list[Any]:
    """Embedding, blocks, final norm and output head as DeepSpeed layer specs."""
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
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
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
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
