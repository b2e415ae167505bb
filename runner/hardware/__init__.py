"""The machine: peak FLOP/s, device and host memory, and what a CPU lacks."""
