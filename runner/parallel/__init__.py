"""Tensor and pipeline parallelism: how the model is cut across ranks."""
