"""Submitting a sweep to SLURM through submitit and watching it: the ladder_slurm Hydra launcher's work."""
