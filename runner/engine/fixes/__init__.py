"""DeepSpeed's faults, one module each, named for what it fixes and applied in one ordered place."""
