"""What one rank's attempt is given, fixed before its engine is built: one frozen context.

The launching process decides the job (:class:`RankJob`: the typed config, its layout and
DeepSpeed's config dict) once, for every rank; a rank adds where it runs and who it is
(:class:`RunContext`). Everything under runner/train/ reads these instead of passing the
same parameters down.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner.config import TrainConfig
from runner.environment import DistributedEnv
from runner.layout import Layout
from runner.metrics.wall_clock import BeforeRanks
from runner.rundir.identity import RunIdentity
from runner.rundir.json_types import JsonObject

if TYPE_CHECKING:  # torch only for the annotation: the launching process never imports it
    import torch

    from runner.train.preemption import StopSignals


@dataclass(frozen=True)
class RankJob:
    """What every rank of one run trains: the config, its layout, and DeepSpeed's config dict
    (as ``deepspeed_config.json`` keeps it). Decided once, by the launching process."""

    config: TrainConfig
    layout: Layout
    ds_config: JsonObject
    before: BeforeRanks | None = None  # the launching process's wait, counted in the wall time


@dataclass(frozen=True)
class RunContext:
    """One rank's attempt: the job, the run directory, this rank and its device."""

    job: RankJob
    run_dir: Path
    env: DistributedEnv
    identity: RunIdentity
    device: torch.device
    accelerator: str  # "cuda" or "cpu" (runner/engine/distributed.py)
    process_group_s: float = 0.0  # the part of launch spent joining the process group
    stop: StopSignals | None = None  # None: this launcher sends no stop signal to watch for

    @property
    def config(self) -> TrainConfig:
        """The run's typed config."""
        return self.job.config

    @property
    def layout(self) -> Layout:
        """The run's layout (gpus, dp, tp, pp, micro, accum, global)."""
        return self.job.layout

    @property
    def rank(self) -> int:
        """This rank's global rank."""
        return self.env.rank

    @property
    def lead(self) -> bool:
        """Rank 0: it owns the metric sinks and writes summary.json."""
        return self.env.rank == 0

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel rank (rank order: tp or sp innermost, then pp, then dp)."""
        return self.env.rank // self.layout.model_parallel
