"""A bare DeepSpeed loop: the same model and DeepSpeed config as a ladder run, nothing else.

Started by torchrun from bench/overhead.py: ``torchrun --nproc_per_node N bench/bare_loop.py
RUN_DIR STEPS OUT``. It reads the ladder run's config and deepspeed_config.json, trains
on pre-made random tokens, and writes the per-step times (seconds) of rank 0 to OUT.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")

import deepspeed
import torch.distributed as dist

from launchers.compose import load_config
from runner.model.transformer import build_model, lm_loss


def main() -> None:
    """Train for STEPS steps and record each step's wall time."""
    run_dir, steps, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    config = load_config(run_dir)
    ds_config = json.loads((run_dir / "deepspeed_config.json").read_text())
    # DeepSpeed's own batch keys, as the bare loop hands them to DeepSpeed.
    micro_size = int(ds_config["train_micro_batch_size_per_gpu"])
    accum_steps = int(ds_config["gradient_accumulation_steps"])
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.get_world_size()))
    device = (
        torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    torch.manual_seed(config.seed)
    model = build_model(config.model, seed=config.seed)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    generator = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(
        0, config.model.vocab_size, (micro_size, config.data.seq_len + 1), generator=generator
    ).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        for _ in range(accum_steps):
            loss = lm_loss(engine(inputs), targets)
            engine.backward(loss)
            engine.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
