"""What the step-time model reads of a device: its measured figures (figures.py, a calibration file's
record), and the measurements that make them (block_timing.py, zero3_overhead.py)."""
