"""The bytes one checkpoint puts on disk, by arithmetic, and whether the run directory holds them.

A DeepSpeed checkpoint (``engine.save_checkpoint``, DeepSpeed 0.19.8) is, over all ranks:

- the module's weights in their working dtype, once per model-parallel rank (written by
  data-parallel rank 0: ``mp_rank_*_model_states.pt``, or a pipeline's ``layer_*`` files),
  none under ZeRO-3 (its model-states files hold partition metadata only);
- the optimizer's fp32 state, partitioned over data parallelism at ZeRO 1-3
  (``*zero_pp_rank_*_optim_states.pt``): the fp32 master weight and Adam's m and v, 12 bytes
  a parameter (runner/memory.py ``bytes_per_param``; ZeRO keeps its fp32 master as a copy of
  its own even when the model trains in fp32). Stage 0 (``parallel=ddp``) saves its
  optimizer's ``state_dict`` beside the module: torch's state (m, v) in fp32, with the fp32
  masters under 16-bit precision (DeepSpeed's FP16_UnfusedOptimizer).

So 16 bytes a parameter for ZeRO 1-2 in fp32, 14 in bf16/fp16, 12 at ZeRO-3, and at stage 0
12 in fp32, 14 in 16-bit, 26 in bf16 under a pipeline (Adam; SGD's one momentum buffer is 4
bytes of it). Tensor
parallelism saves the norm gains once per tp rank; a pipeline with tied embeddings keeps
the optimizer state of the embedding on its first stage and of the output head on its
last. Against the files DeepSpeed writes (tiny on 1 and 2 ranks: ZeRO 0-3, tp, pp, bf16,
offload, SGD; bench/checkpoint_size.py) it lies within 0.4% below them: what it leaves out is
each rank's RNG file, ZeRO-3's partition metadata and each tensor's pickled record, a few
hundred bytes apiece (1.4% of tiny at half width). Every leg of tests/train_helpers.py
``run_in_legs`` checks it within 2%.

A checkpoint is written beside the ones kept (runner/checkpoint.py writes
``.partial-<tag>``, then drops the oldest), so a run keeping K of them holds K + 1 at its
peak.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from runner.config import ModelConfig, TrainConfig
from runner.memory import FP32_BYTES, bytes_per_param
from runner.model_shape import num_params


def saved_elements(model: ModelConfig, *, tp: int, pp: int) -> tuple[int, int]:
    """(elements of the saved weights, elements with optimizer state), summed over every rank.

    Tensor parallelism cuts the matrices and the vocabulary and keeps the norm gains whole on
    each of its ranks (runner/tensor_parallel.py); a pipeline holds a tied embedding twice,
    the lookup on its first stage and the output head on its last, each with its optimizer
    state, and saves the weight once.
    """
    norms = (2 * model.n_layer + 1) * model.d_model
    weights = num_params(model) + (tp - 1) * norms
    tied_head = model.vocab_size * model.d_model if pp > 1 and model.tie_embeddings else 0
    return weights, weights + tied_head


def saved_bytes_per_param(precision: str, optimizer: str, zero_stage: int, *, pp: int = 1) -> tuple[int, int]:
    """(bytes of the saved weight, bytes of the saved optimizer state) per parameter."""
    weight, _, state = bytes_per_param(precision, optimizer)
    if zero_stage >= 1 and precision == "fp32":
        state += FP32_BYTES  # ZeRO's own fp32 master partition (bytes_per_param counts none in fp32)
    if zero_stage == 0 and precision == "bf16" and pp > 1:
        # DeepSpeed's BF16_Optimizer (engine.py ``_do_optimizer_sanity_check``: bf16 at stage 0
        # under a pipeline) has its state saved twice: in the model-states files, as any stage-0
        # optimizer's, and in its own bf16_zero_* files (``_save_checkpoint``, ``_save_zero_checkpoint``).
        state *= 2
    return (0 if zero_stage == 3 else weight), state


def checkpoint_bytes(
    model: ModelConfig, *, precision: str, optimizer: str, zero_stage: int, tp: int = 1, pp: int = 1
) -> int:
    """Bytes of one checkpoint, every rank's files together (see the module docstring)."""
    weight, state = saved_bytes_per_param(precision, optimizer, zero_stage, pp=pp)
    weights, with_state = saved_elements(model, tp=tp, pp=pp)
    return weights * weight + with_state * state


def config_checkpoint_bytes(config: TrainConfig) -> int:
    """:func:`checkpoint_bytes` for this run's model, precision, optimizer and layout."""
    return checkpoint_bytes(
        config.model,
        precision=config.precision.name.value,
        optimizer=config.optimizer.name.value,
        zero_stage=config.parallel.zero_stage,
        tp=config.parallel.tp,
        pp=config.parallel.pp,
    )


@dataclass(frozen=True)
class DiskNeed:
    """What a run's checkpoints will add to the filesystem of its directory."""

    each: int  # bytes of one checkpoint
    kept: int  # train.keep_checkpoints
    saves: int  # checkpoints the run will write (at least the one a stop writes)
    on_disk: int  # complete checkpoints the run directory holds already
    free: int  # bytes free on its filesystem now
    where: Path  # the directory whose filesystem was asked

    @property
    def to_write(self) -> int:
        """Checkpoints on disk at the peak beyond those there now.

        Each save writes its checkpoint before it drops the oldest beyond ``kept``
        (runner/checkpoint.py ``_prune``): a run that saves often enough peaks at K + 1.
        """
        return self._peak - self.on_disk

    @property
    def _peak(self) -> int:
        return max(self.on_disk + 1, min(self.on_disk + self.saves, self.kept + 1))

    @property
    def stays(self) -> int:
        """Bytes of the checkpoints still on disk after the run, beyond those there before."""
        return (min(self.on_disk + self.saves, max(self.kept, self.on_disk)) - self.on_disk) * self.each

    @property
    def needed(self) -> int:
        return self.to_write * self.each

    @property
    def fits(self) -> bool:
        return self.needed <= self.free

    def arithmetic(self) -> str:
        """``3 x 0.052 GB = 0.155 GB (...), 0.030 GB free on the filesystem of /path``."""
        if self._peak == self.kept + 1:
            why = f"train.keep_checkpoints={self.kept}, and one written before the oldest goes"
        else:
            why = f"{self.saves} save{'s' if self.saves > 1 else ''} in the run"
        held = f"; {self.on_disk} there already" if self.on_disk else ""
        return (
            f"{self.to_write} x {self.each / 1e9:.3f} GB = {self.needed / 1e9:.3f} GB ({why}{held}), "
            f"{self.free / 1e9:.3f} GB free on the filesystem of {self.where}"
        )

    def record(self) -> dict[str, object]:
        """The JSON-ready figures: plan.json's ``checkpoint_disk``."""
        return {
            "checkpoint_bytes": self.each,
            "keep_checkpoints": self.kept,
            "saves": self.saves,
            "on_disk": self.on_disk,
            "peak_bytes_to_write": self.needed,
            "free_bytes": self.free,
            "filesystem_of": str(self.where),
            "fits": self.fits,
        }


def _existing_folder(path: Path) -> Path:
    """``path`` or its nearest existing parent: where its files will land."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_need(config: TrainConfig, run_dir: Path, *, done_steps: int = 0, on_disk: int = 0) -> DiskNeed:
    """The run's checkpoints against the free space of ``run_dir``'s filesystem, now.

    ``done_steps``: the steps a resumed run has behind it; ``on_disk``: the complete
    checkpoints its directory holds.
    """
    where = _existing_folder(run_dir)
    every, left = config.train.checkpoint_every, max(0, config.train.steps - done_steps)
    return DiskNeed(
        each=config_checkpoint_bytes(config),
        kept=config.train.keep_checkpoints,
        saves=max(1, left // every) if every else 1,
        on_disk=on_disk,
        free=shutil.disk_usage(where).free,
        where=where,
    )


def disk_problem(need: DiskNeed, config: TrainConfig) -> str | None:
    """The refusal of a run whose periodic checkpoints cannot fit on its filesystem, or None."""
    if need.fits or not config.train.checkpoint_every:
        return None
    fewer = ""
    if need.kept > 1:
        one = dataclasses.replace(need, kept=1)
        if one.fits:
            fewer = f"keep fewer (train.keep_checkpoints=1 needs {one.needed / 1e9:.3f} GB), "
    return (
        f"train.checkpoint_every={config.train.checkpoint_every}: the run's checkpoints need "
        f"{need.arithmetic()}: free space there, {fewer}or write the run elsewhere (hydra.run.dir=..., "
        f"or hydra.sweep.dir=... for a sweep); with train.checkpoint_every=0 it saves only when stopped"
    )


def sweep_disk_problem(configs: list[TrainConfig], sweep_dir: Path, *, at_once: bool = False) -> str | None:
    """The refusal of a new sweep whose cells' checkpoints cannot all fit, or None.

    Each cell keeps its checkpoints when it ends. Cells that run one after another (a local
    sweep) need what every cell keeps plus the one written beside them at the fullest save;
    cells that may run ``at_once`` (a SLURM job array) every cell's peak together. Each
    cell's own check (:func:`disk_problem`) runs as it starts, against what is free then.
    """
    needs = [disk_need(config, sweep_dir) for config in configs if config.train.checkpoint_every]
    if len(needs) < 2:
        return None
    if at_once:
        total, how = sum(need.needed for need in needs), "if they all save at once"
    else:
        total = sum(need.stays for need in needs) + max(need.needed - need.stays for need in needs)
        how = "each cell's kept ones stay after it ends; one more at the fullest save"
    free, where = needs[0].free, needs[0].where
    if total <= free:
        return None
    return (
        f"the sweep's {len(needs)} cells with train.checkpoint_every need {total / 1e9:.3f} GB of "
        f"checkpoints between them ({how}), {free / 1e9:.3f} GB free on the filesystem of {where}: "
        f"free space there, keep fewer (train.keep_checkpoints), or write the sweep elsewhere "
        f"(hydra.sweep.dir=...)"
    )


def stop_save_warning(need: DiskNeed, config: TrainConfig) -> str | None:
    """A run without periodic checkpoints whose stop's checkpoint would not fit: a warning, or None."""
    if need.fits or config.train.checkpoint_every:
        return None
    return (
        f"the checkpoint a stop writes (Ctrl-C, SIGTERM, a SLURM time limit) would not fit: "
        f"{need.each / 1e9:.3f} GB, {need.free / 1e9:.3f} GB free on the filesystem of {need.where}; "
        f"a stopped run could not be continued"
    )


__all__ = [
    "DiskNeed",
    "checkpoint_bytes",
    "config_checkpoint_bytes",
    "disk_need",
    "disk_problem",
    "saved_bytes_per_param",
    "saved_elements",
    "stop_save_warning",
    "sweep_disk_problem",
]
