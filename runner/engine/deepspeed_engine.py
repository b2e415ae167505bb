"""What ladder uses of DeepSpeed's engine, as Protocols: the type every ``engine`` parameter takes.

``deepspeed.initialize`` returns a ``DeepSpeedEngine`` (deepspeed/runtime/engine.py, 0.19.8), or
a ``PipelineEngine`` (deepspeed/runtime/pipe/engine.py) around a pipeline's stages (pp > 1).
DeepSpeed ships no type information, so these Protocols list the members ladder reads, calls or
replaces, with the types ladder relies on; they are for annotations only, and nothing checks an
engine against them at run time. A member named with a leading underscore is DeepSpeed's
private one, which a module of runner/engine/fixes/ or the step's hooks replace or read (each
says why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

import torch


class DeepSpeedEngine(Protocol):
    """DeepSpeed's engine around one rank's model: forward, backward, the optimizer step, checkpoints."""

    module: torch.nn.Module  # the model the engine wraps (a PipelineModule under a pipeline)
    # DeepSpeed's optimizer wrapper (ZeRO's, BF16_Optimizer, FP16_Optimizer), or the torch
    # optimizer itself at stage 0 in fp32: what each fix needs of it differs by class.
    optimizer: Any
    basic_optimizer: torch.optim.Optimizer  # the torch optimizer inside the wrapper
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None
    checkpoint_engine: Any  # reads and writes the files (runner/engine/fixes/pickle_in_checkpoints.py)
    mpu: Any  # the model-parallel unit: a pipeline's grid, DeepSpeed's groups under AutoTP, or None
    device: torch.device
    # The step's gradient norm, as get_global_grad_norm reports it; a fix sets it where it
    # clips itself (runner/engine/fixes/pipeline_fp32_clip.py).
    _global_grad_norm: float | None
    clip_fp32_gradients: Callable[[], None]  # replaced by runner/engine/fixes/pipeline_fp32_clip.py

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The model's forward; ladder's models form the loss in it (runner/model/transformer.py)."""
        ...

    def backward(self, loss: torch.Tensor) -> Any:
        """Backward of ``loss``, scaled by the loss scale in fp16 and by 1 / accumulation steps."""
        ...

    def step(self) -> None:
        """The optimizer step at the accumulation boundary (before it, only the micro-step counts)."""
        ...

    def get_lr(self) -> list[float]:
        """Each parameter group's learning rate."""
        ...

    def get_global_grad_norm(self) -> float | None:
        """The last step's gradient norm over the whole model (None where DeepSpeed computes none)."""
        ...

    def fp16_enabled(self) -> bool:
        """Whether the engine trains in fp16."""
        ...

    def bfloat16_enabled(self) -> bool:
        """Whether the engine trains in bf16."""
        ...

    def zero_optimization(self) -> bool:
        """Whether a ZeRO stage above 0 runs."""
        ...

    def zero_optimization_stage(self) -> int:
        """The ZeRO stage, 0 to 3."""
        ...

    def load_universal_checkpoint(self) -> bool:
        """Whether the engine loads DeepSpeed's universal checkpoint format."""
        ...

    def autotp_size(self) -> int:
        """The tensor-parallel degree AutoTP cut the model by."""
        ...

    def save_checkpoint(
        self,
        save_dir: str,
        tag: str | None = None,
        client_state: dict[str, Any] | None = None,
        save_latest: bool = True,
    ) -> bool:
        """Write this rank's part of the checkpoint ``tag`` under ``save_dir`` (collective)."""
        ...

    def load_checkpoint(
        self, load_dir: str, tag: str | None = None, load_optimizer_states: bool = True
    ) -> tuple[str | None, dict[str, Any] | None]:
        """Load the checkpoint ``tag``: its path and client state, or (None, None) where none loaded."""
        ...

    def _get_all_zero_checkpoints(self, load_dir: str, tag: str) -> list[dict[str, Any]] | None:
        """The optimizer-state files of ``tag`` (runner/engine/fixes/bf16_stage0_optimizer_load.py)."""
        ...


class PipelineStages(Protocol):
    """What ladder uses of a PipelineModule (deepspeed/runtime/pipe/module.py) beyond torch's Module."""

    parts: list[int]  # each stage's first layer, then the end: stage s holds [parts[s], parts[s + 1])
    # The loss a last stage forms from its output and the labels; the engine calls it in its forward pass.
    loss_fn: Callable[..., torch.Tensor] | None


class PipelineEngine(DeepSpeedEngine, Protocol):
    """DeepSpeed's PipelineEngine: runs a batch's micro-batches itself, 1F1B, through its instruction map."""

    grid: Any  # the pipeline's PipelineParallelGrid: its data, pipe and model-parallel groups
    total_loss: torch.Tensor | None  # a last stage's loss summed over the step's micro-batches so far
    # The method each of the schedule's instructions runs (a class attribute; an instance's own
    # map takes its place: runner/train/pipeline_hooks.py).
    _INSTRUCTION_MAP: dict[type, Callable[..., Any]]
    # The optimizer step at the boundary, which the schedule's OptimizerStep instruction calls
    # (replaced on the instance by runner/train/pipeline_hooks.py, to check the loss first).
    _take_model_step: Callable[..., Any]

    def is_last_stage(self) -> bool:
        """Whether this rank holds the pipeline's last stage, where the loss is formed."""
        ...

    def train_batch(self, data_iter: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over the batch's micro-batches; the loss, their mean and the pipelines'."""
        ...

    def eval_batch(self, data_iter: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The forward-only loss over one batch's micro-batches, their mean and the pipelines'."""
        ...


def as_pipeline(engine: DeepSpeedEngine) -> PipelineEngine:
    """``engine`` as the PipelineEngine it is when pp > 1 (``deepspeed.initialize`` makes one for a
    PipelineModule); the caller knows pp > 1, and nothing is checked."""
    return cast(PipelineEngine, engine)


def pipeline_stages(engine: PipelineEngine) -> PipelineStages:
    """A pipeline engine's module as a PipelineModule: its stage boundaries and loss."""
    return cast(PipelineStages, engine.module)
