"""ladder's local sweep launcher, the default ``hydra/launcher``: every cell checked before the first trains.

Hydra finds launchers only inside the ``hydra_plugins`` namespace package (hydra
core/plugins.py), so this thin shell lives here; the work is in launchers/local_sweep.py.
"""
