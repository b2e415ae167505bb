"""The schema of ``hydra/launcher=slurm``: the fields a user may override, and nothing derived.

Field names follow hydra-submitit-launcher's ``SlurmQueueConf``. Nodes, tasks per node
and GPUs per node are absent on purpose: each cell's come from its ``gpus`` and the
cluster group (launchers/slurm/resources.py), so overriding them is a composition error.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class LadderSlurmConf:
    """hydra.launcher for SLURM sweeps; see conf/hydra/launcher/slurm.yaml for each field."""

    _target_: str = "hydra_plugins.ladder_slurm.launcher.LadderSlurmLauncher"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    comment: str | None = None
    timeout_min: int = 60
    mem_gb: int | None = None
    cpus_per_task: int | None = None
    array_parallelism: int = 256
    name: str = "${hydra.job.name}"
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    stderr_to_stdout: bool = False
    signal_delay_s: int = 120
    max_num_timeout: int = 3
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    setup: list[str] | None = None


ConfigStore.instance().store(
    group="hydra/launcher", name="slurm_schema", node=LadderSlurmConf, provider="ladder"
)
