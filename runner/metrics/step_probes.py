"""What a step is measured by besides its loss and time: the noise scale and exposed communication.

Both are read from the step as it runs, at no extra forward or backward pass:

- the gradient noise scale (runner/metrics/noise_scale.py) from each micro-batch's gradient,
  read by parameter hooks during backward (runner/metrics/grad_probe.py), against the step's
  reduced gradient norm;
- exposed communication (runner/metrics/comm_timer.py): the seconds the training thread is
  blocked in DeepSpeed's collectives.

The training loop calls :meth:`StepProbes.step_started`, :meth:`micro_batch_done` after
each backward, and :meth:`step_done` once the optimizer has stepped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from runner.engine.deepspeed_engine import DeepSpeedEngine, as_pipeline
from runner.layout import Layout
from runner.metrics.comm_timer import UNMEASURED_ON_CUDA, CollectiveTimer, deepspeed_backend
from runner.metrics.grad_probe import REPLICATED, SHARDED, MicroGradSquares
from runner.metrics.noise_scale import NoiseScale, why_unmeasured
from runner.parallel.tensor import is_sharded
from runner.rundir.summary_records import StepProbesRecord


def loss_scale(engine: DeepSpeedEngine) -> float:
    """The fp16 loss scale backward saw (1 in fp32 and bf16, which DeepSpeed does not scale)."""
    if not engine.fp16_enabled():
        return 1.0
    scale: Any = getattr(engine.optimizer, "loss_scale", None) or getattr(engine.optimizer, "cur_scale", 1.0)
    return float(scale)


def _whole_model_mean(squares: torch.Tensor, *, group: Any) -> float:
    """One micro-batch's |g|² of the whole model, averaged over the data-parallel ranks.

    ``squares`` is runner/metrics/grad_probe.py's [sharded, whole] pair: the shards' squares are
    summed over ``group`` (the tensor-parallel group, or a pipeline's stages; None: no
    model parallelism), the whole tensors' (the same on every rank of it) counted once;
    every rank of the group then holds the same figure, so the mean over all ranks is the
    mean over the data-parallel ranks.
    """

    sharded = squares[SHARDED].clone()
    if group is not None:
        dist.all_reduce(sharded, op=dist.ReduceOp.SUM, group=group)
    total = sharded + squares[REPLICATED]
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total.item()) / dist.get_world_size()


def _model_parallel(
    engine: DeepSpeedEngine, layout: Layout
) -> tuple[Any, Callable[[torch.nn.Parameter], bool], Callable[[torch.nn.Parameter], bool]]:
    """The group over which a micro-batch's gradient is split, which parameters it splits,
    and which this rank counts.

    A pipeline stage's squares add up with the other stages' (each layer lives on one
    stage); a tensor-parallel shard's with its group's, a replica's counted once. Under
    both, the group is the pipeline grid's model-parallel one (pipe x tp): every counted
    tensor is summed over it, and a tensor each rank of a stage holds whole (the norms) is
    counted on that stage's first tensor-parallel rank only.
    """
    if layout.pp > 1 and layout.tp > 1:
        grid = as_pipeline(engine).grid
        first_of_slice = grid.get_slice_parallel_rank() == 0
        return grid.get_model_parallel_group(), lambda _: True, lambda p: first_of_slice or is_sharded(p)
    if layout.pp > 1:
        return as_pipeline(engine).grid.get_pipe_parallel_group(), lambda _: True, lambda _: True
    if layout.tp > 1:
        # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
        from deepspeed.utils import groups

        return groups.get_tensor_model_parallel_group(), is_sharded, lambda _: True
    return None, lambda _: False, lambda _: True


class StepProbes:
    """The noise scale and exposed communication of each step, and their summary.json entries."""

    def __init__(
        self, engine: DeepSpeedEngine, *, layout: Layout, device: torch.device, tied_embeddings: bool = False
    ) -> None:
        self.layout = layout
        self.noise = NoiseScale(ema=0.95)
        self.noise_unmeasured = why_unmeasured(
            gradients_per_step=layout.accum_steps * layout.dp, pp=layout.pp, tied_embeddings=tied_embeddings
        )
        self._model_group, split, counted = _model_parallel(engine, layout)
        self._grads = (
            MicroGradSquares([p for p in engine.module.parameters() if counted(p)], device, is_sharded=split)
            if self.noise_unmeasured is None
            else None
        )
        # On CUDA, NCCL returns once queued: host-blocked time is not exposure there.
        self._comm = CollectiveTimer().install(deepspeed_backend()) if device.type == "cpu" else None
        self.comm_exposed_s = float("nan")

    def step_started(self) -> None:
        """Forget what ran between steps (logging, checkpoints): it is not the step's."""
        if self._comm is not None:
            self._comm.take()

    def micro_batch_done(self, engine: DeepSpeedEngine) -> None:
        """Close one micro-batch's gradient; DeepSpeed's backward took loss / accum_steps."""
        if self._grads is not None:
            self._grads.end_micro_batch(grad_scale=self.layout.accum_steps / loss_scale(engine))

    def step_done(self, *, grad_norm: float | None, skipped: bool) -> dict[str, float]:
        """This step's metrics; ``grad_norm`` is the step's reduced gradient norm (B_big = global)."""
        if self._comm is not None:
            self.comm_exposed_s = self._comm.take()
        if self._grads is not None:
            small_sq_norm = _whole_model_mean(self._grads.take_mean(), group=self._model_group)
            # A skipped step's gradients are not finite: ladder's non-finite loss, or an fp16
            # overflow DeepSpeed's loss scaler skipped (its norm inf).
            if grad_norm is not None and math.isfinite(grad_norm) and not skipped:
                self.noise.update(
                    small_sq_norm=small_sq_norm,
                    small_batch=self.layout.micro_size,
                    big_sq_norm=float(grad_norm) ** 2,
                    big_batch=self.layout.global_size,
                )
        noise = self.noise.value
        return {
            "batch/noise_scale": noise if noise is not None else float("nan"),
            "time/comm_exposed_s": self.comm_exposed_s,
        }

    def summary(self, *, seq_len: int) -> StepProbesRecord:
        """summary.json's ``noise_scale`` and ``comm_exposed`` entries."""
        return {
            "noise_scale": self.noise.summary(seq_len=seq_len, unmeasured=self.noise_unmeasured),
            "comm_exposed": {
                "seconds_per_step": self.comm_exposed_s,
                "definition": "seconds the training thread is blocked in DeepSpeed's collectives "
                "per step (runner/metrics/comm_timer.py)",
                "unmeasured": None if self._comm is not None else UNMEASURED_ON_CUDA,
            },
        }
