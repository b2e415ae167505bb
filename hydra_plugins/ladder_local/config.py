"""The schema of ``hydra/launcher=local`` (the default): Hydra's BasicLauncher, run by ladder."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class LadderLocalConf:
    """hydra.launcher for sweeps on this host: one cell after another, in this process."""

    _target_: str = "hydra_plugins.ladder_local.launcher.LadderLocalLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="local", node=LadderLocalConf, provider="ladder")
