"""How ranks come to exist: local processes on this host, or torchrun / deepspeed / srun."""
