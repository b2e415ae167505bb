"""Checkpoints: save, keep, resume, and convert between layouts."""
