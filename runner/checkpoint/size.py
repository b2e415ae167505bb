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

A checkpoint is written beside the ones kept (runner/checkpoint/save.py writes
``.partial-<tag>``, then drops the oldest), so a run keeping K of them holds K + 1 at its
peak.

A resume onto another layout first converts its checkpoint, beside it, to DeepSpeed's
universal format (``deepspeed.checkpoint.ds_to_universal``; ladder's own for stage 0): every
parameter whole in fp32 with its optimizer state in fp32 (``zero/<name>/fp32.pt``,
``exp_avg.pt``, ``exp_avg_sq.pt``; a tied weight's second name gets its fp32 copy), and the
source's model-states files (its weights in their working dtype at ZeRO 1-2 and, from stage 0,
rank 0's). ``ds_to_universal`` first extracts each rank's fragments into a temporary folder,
the same bytes again, removed once merged: its peak. A stage-0 target that does not load the
universal format itself gets a stage-0 checkpoint of its own layout written from it. The
copies stay until the checkpoint they came from is pruned.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from runner.config import ModelConfig, OptimizerName, Precision, TrainConfig, ZeroStage
from runner.engine.optimizer_wrapper import OptimizerWrapper, optimizer_wrapper
from runner.memory_model.states import bytes_per_param
from runner.memory_model.units import FP32_BYTES
from runner.model.shape import num_params, param_numels


def saved_elements(model: ModelConfig, *, tp: int, pp: int) -> tuple[int, int]:
    """(elements of the saved weights, elements with optimizer state), summed over every rank.

    Tensor parallelism cuts the matrices and the vocabulary and keeps the norm gains whole on
    each of its ranks (runner/parallel/tensor.py); a pipeline holds a tied embedding twice,
    the lookup on its first stage and the output head on its last, each with its optimizer
    state, and saves the weight once.
    """
    norms = (2 * model.n_layer + 1) * model.d_model
    weights = num_params(model) + (tp - 1) * norms
    tied_head = model.vocab_size * model.d_model if pp > 1 and model.tie_embeddings else 0
    return weights, weights + tied_head


def saved_bytes_per_param(
    precision: Precision | str, optimizer: OptimizerName | str, zero_stage: ZeroStage | int, *, pp: int = 1
) -> tuple[int, int]:
    """(bytes of the saved weight, bytes of the saved optimizer state) per parameter."""
    stage = ZeroStage(zero_stage)
    weight, _, state = bytes_per_param(precision, optimizer)
    if stage.shards_optimizer_states and precision == Precision.fp32:
        state += FP32_BYTES  # ZeRO's own fp32 master partition (bytes_per_param counts none in fp32)
    wrapper = optimizer_wrapper(precision=precision, zero_stage=zero_stage, pp=pp)
    if wrapper is OptimizerWrapper.bf16_optimizer:
        # DeepSpeed's BF16_Optimizer (bf16 at stage 0 under a pipeline: runner/engine/optimizer_wrapper.py)
        # has its state saved twice: in the model-states files, as any stage-0 optimizer's, and
        # in its own bf16_zero_* files (engine.py ``_save_checkpoint``, ``_save_zero_checkpoint``).
        state *= 2
    return (0 if stage.shards_parameters else weight), state


def checkpoint_bytes(
    model: ModelConfig,
    *,
    precision: Precision | str,
    optimizer: OptimizerName | str,
    zero_stage: ZeroStage | int,
    tp: int = 1,
    pp: int = 1,
) -> int:
    """Bytes of one checkpoint, every rank's files together (see the module docstring)."""
    weight, state = saved_bytes_per_param(precision, optimizer, zero_stage, pp=pp)
    weights, with_state = saved_elements(model, tp=tp, pp=pp)
    return weights * weight + with_state * state


def config_checkpoint_bytes(config: TrainConfig) -> int:
    """:func:`checkpoint_bytes` for this run's model, precision, optimizer and layout."""
    return checkpoint_bytes(
        config.model,
        precision=config.precision.name,
        optimizer=config.optimizer.name,
        zero_stage=config.parallel.zero_stage,
        tp=config.parallel.tp,
        pp=config.parallel.pp,
    )


# The zip records torch.save writes around one small tensor's bytes (torch 2.13: 1.5-1.7 kB),
# which the universal format's thousands of one-tensor files add up (0.26 MB of tiny's 52 MB).
SAVED_FILE_RECORDS = 1_600


def universal_bytes(
    model: ModelConfig,
    *,
    optimizer: OptimizerName | str,
    zero_stage: ZeroStage | int,
    precision: Precision | str,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
) -> tuple[int, int]:
    """(bytes of the universal copy of a checkpoint saved so, the most on disk while it is written).

    See the module docstring; ``precision`` and the layout are the saved checkpoint's. While
    ``ds_to_universal`` runs, beside its temporary fragments, two files hold more than they
    keep (ladder trims both after it, runner/checkpoint/universal_every_stage.py
    ``loadable_at_every_stage``): from
    ZeRO-3, ``zero/optimizer_state.pt`` is rank 0's whole optimizer file (its fp32 partition
    and moments); from ZeRO 1-2 in fp32, a tied weight's second name is saved as a view of
    the model-states file's storage, so with every weight of that file.
    """
    stage = ZeroStage(zero_stage)
    state = bytes_per_param(Precision.fp32, optimizer)[2]
    tied = model.vocab_size * model.d_model if model.tie_embeddings else 0
    # One file a tensor per key (fp32, each optimizer state, step), and the tied weight's fp32.
    files = len(param_numels(model)) * (2 + state // FP32_BYTES) + (1 if tied else 0)
    whole = num_params(model) * (FP32_BYTES + state) + tied * FP32_BYTES + files * SAVED_FILE_RECORDS
    weights, _ = saved_elements(model, tp=tp, pp=pp)
    weight = bytes_per_param(precision, optimizer)[0]
    if pp > 1 or stage.shards_parameters:
        model_states = 0  # the weights are in the layer files (not copied), or nowhere (ZeRO-3)
    elif stage is ZeroStage.ddp:
        model_states = weights // tp * weight  # rank 0's file, the optimizer left out
    else:
        model_states = weights * weight  # every tp rank's file, copied
    if stage is ZeroStage.ddp:  # ladder's own conversion: no temporary files
        return whole + model_states, whole + model_states
    fragments = num_params(model) * (FP32_BYTES + state)  # ds_to_universal's temporary folder
    if stage is ZeroStage.zero3:
        fragments += num_params(model) // dp * (FP32_BYTES + state)
    elif precision == Precision.fp32 and tied and pp == 1:
        fragments += weights // tp * weight
    return whole + model_states, whole + max(fragments, model_states)


@dataclass(frozen=True)
class Conversion:
    """What a resume onto another layout writes beside its checkpoint before the first step."""

    tag: str  # the checkpoint converted
    stays: int  # bytes of the copies, on disk until that checkpoint is pruned
    peak: int  # the most they take while being written
    own_layout: str  # the overrides that resume it unmoved: ``gpus=2 parallel.zero_stage=1``

    def words(self) -> str:
        return f"{self.stays / 1e9:.3f} GB of {self.tag} converted for this layout"


@dataclass(frozen=True)
class DiskNeed:
    """What a run's checkpoints will add to the filesystem of its directory."""

    each: int  # bytes of one checkpoint
    kept: int  # train.keep_checkpoints
    # The checkpoints this check weighs: the periodic ones and the one after the last step
    # (train.save_final), or the one a stop would write where there are none. Not a count of
    # checkpoints written: summary.json's wall_time.checkpoints_written is that.
    saves: int
    on_disk: int  # complete checkpoints the run directory holds already
    free: int  # bytes free on its filesystem now
    where: Path  # the directory whose filesystem was asked
    conversion: Conversion | None = None  # a resume onto another layout
    periodic_saves: int = 0  # the checkpoints train.checkpoint_every will write (0 when it is 0)
    final_save: bool = False  # train.save_final's after the last step, where no periodic one falls

    @property
    def to_write(self) -> int:
        """Checkpoints on disk at the peak beyond those there now.

        Each save writes its checkpoint before it drops the oldest beyond ``kept``
        (runner/checkpoint/save.py ``_prune``): a run that saves often enough peaks at K + 1.
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
        """The most the run adds: its checkpoints at their peak, beside the copies a move converts."""
        saves = self.to_write * self.each
        if self.conversion is None:
            return saves
        return max(self.conversion.peak, self.conversion.stays + saves)

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
        saves = f"{self.to_write} x {self.each / 1e9:.3f} GB"
        if self.conversion is not None:
            saves = f"{saves} + {self.conversion.words()}"
        return (
            f"{saves} = {self.needed / 1e9:.3f} GB ({why}{held}), "
            f"{self.free / 1e9:.3f} GB free on the filesystem of {self.where}"
        )

    def conversion_problem(self) -> str | None:
        """The refusal of a move whose conversion alone cannot fit, or None."""
        if self.conversion is None or self.conversion.peak <= self.free:
            return None
        return (
            f"train.resume=auto: moving {self.conversion.tag} to this layout writes a converted copy "
            f"beside it (DeepSpeed's universal format): {self.conversion.peak / 1e9:.3f} GB at the most "
            f"while it is written, {self.free / 1e9:.3f} GB free on the filesystem of {self.where}: free "
            f"space there, or resume on the checkpoint's own layout ({self.conversion.own_layout}), "
            f"which needs no copy"
        )

    def to_json(self) -> dict[str, object]:
        """The JSON-ready figures: plan.json's ``checkpoint_disk``."""
        return {
            "checkpoint_bytes": self.each,
            "keep_checkpoints": self.kept,
            "saves": self.saves,  # as saves_weighed, the name it had first
            "saves_weighed": self.saves,
            "periodic_saves": self.periodic_saves,
            "final_save": self.final_save,
            # no periodic or final save: the one a stop writes
            "stop_save_weighed": self.periodic_saves == 0 and not self.final_save,
            "on_disk": self.on_disk,
            "peak_bytes_to_write": self.needed,
            "free_bytes": self.free,
            "filesystem_of": str(self.where),
            "fits": self.fits,
            "conversion": None
            if self.conversion is None
            else {
                "tag": self.conversion.tag,
                "bytes": self.conversion.stays,
                "peak_bytes": self.conversion.peak,
            },
        }


def _existing_folder(path: Path) -> Path:
    """``path`` or its nearest existing parent: where its files will land."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_need(
    config: TrainConfig,
    run_dir: Path,
    *,
    done_steps: int = 0,
    on_disk: int = 0,
    conversion: Conversion | None = None,
) -> DiskNeed:
    """The run's checkpoints against the free space of ``run_dir``'s filesystem, now.

    ``done_steps``: the steps a resumed run has behind it; ``on_disk``: the complete
    checkpoints its directory holds; ``conversion``: what its move to this layout writes.
    """
    where = _existing_folder(run_dir)
    every, left = config.train.checkpoint_every, max(0, config.train.steps - done_steps)
    # train.save_final's checkpoint after the last step, where no periodic save falls on it
    final = int(config.train.save_final and left > 0 and (not every or left % every != 0))
    return DiskNeed(
        each=config_checkpoint_bytes(config),
        kept=config.train.keep_checkpoints,
        saves=max(1, (left // every if every else 0) + final),
        periodic_saves=left // every if every else 0,
        final_save=bool(final),
        on_disk=on_disk,
        free=shutil.disk_usage(where).free,
        where=where,
        conversion=conversion,
    )


def disk_problem(need: DiskNeed, config: TrainConfig) -> str | None:
    """The refusal of a run whose move to this layout or periodic checkpoints cannot fit on its
    filesystem, or None."""
    if (moving := need.conversion_problem()) is not None:
        return moving
    train = config.train
    if need.fits or not (train.checkpoint_every or train.save_final):
        return None
    fewer = ""
    if need.kept > 1:
        one = dataclasses.replace(need, kept=1)
        if one.fits:
            fewer = f"keep fewer (train.keep_checkpoints=1 needs {one.needed / 1e9:.3f} GB), "
    saves = " ".join(
        words
        for words, chosen in (
            (f"train.checkpoint_every={train.checkpoint_every}", train.checkpoint_every),
            ("train.save_final=true", train.save_final),
        )
        if chosen
    )
    only_stop = "train.checkpoint_every=0" + (" train.save_final=false" if train.save_final else "")
    return (
        f"{saves}: the run's checkpoints need {need.arithmetic()}: free space there, {fewer}or write "
        f"the run elsewhere (hydra.run.dir=..., or hydra.sweep.dir=... for a sweep); with "
        f"{only_stop} it saves only when stopped"
    )


def sweep_disk_problem(configs: list[TrainConfig], sweep_dir: Path, *, at_once: bool = False) -> str | None:
    """The refusal of a new sweep whose cells' checkpoints cannot all fit, or None.

    Each cell keeps its checkpoints when it ends. Cells that run one after another (a local
    sweep) need what every cell keeps plus the one written beside them at the fullest save;
    cells that may run ``at_once`` (a SLURM job array) every cell's peak together. Each
    cell's own check (:func:`disk_problem`) runs as it starts, against what is free then.
    """
    needs = [
        disk_need(config, sweep_dir)
        for config in configs
        if config.train.checkpoint_every or config.train.save_final
    ]
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
        f"the sweep's {len(needs)} cells with {_saving_keys(configs)} need {total / 1e9:.3f} GB of "
        f"checkpoints between them ({how}), {free / 1e9:.3f} GB free on the filesystem of {where}: "
        f"free space there, keep fewer (train.keep_checkpoints), or write the sweep elsewhere "
        f"(hydra.sweep.dir=...)"
    )


def _saving_keys(configs: list[TrainConfig]) -> str:
    """The keys that make a sweep's cells save: ``train.checkpoint_every``, ``train.save_final``."""
    keys = [
        key
        for key, used in (
            ("train.checkpoint_every", any(c.train.checkpoint_every for c in configs)),
            ("train.save_final", any(c.train.save_final for c in configs)),
        )
        if used
    ]
    return " or ".join(keys)


def stop_save_warning(need: DiskNeed, config: TrainConfig) -> str | None:
    """A run that saves only at a stop (no periodic or final checkpoint) whose stop's checkpoint
    would not fit: a warning, or None."""
    if need.fits or config.train.checkpoint_every or config.train.save_final:
        return None
    return (
        f"the checkpoint a stop writes (Ctrl-C, SIGTERM, a SLURM time limit) would not fit: "
        f"{need.each / 1e9:.3f} GB, {need.free / 1e9:.3f} GB free on the filesystem of {need.where}; "
        f"a stopped run could not be continued"
    )


__all__ = [
    "Conversion",
    "DiskNeed",
    "checkpoint_bytes",
    "config_checkpoint_bytes",
    "disk_need",
    "disk_problem",
    "saved_bytes_per_param",
    "saved_elements",
    "stop_save_warning",
    "sweep_disk_problem",
    "universal_bytes",
]
