"""The DeepSpeed engine: its config dict, the model and optimizer it wraps, the process group."""
