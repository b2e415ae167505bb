"""ladder's Hydra launcher plugin: ``hydra/launcher=slurm`` (conf/hydra/launcher/slurm.yaml).

Hydra finds launchers only inside the ``hydra_plugins`` namespace package (hydra
core/plugins.py), so this thin shell lives here; the work is in launchers/slurm*.py.
"""
