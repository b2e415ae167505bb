"""A 16-bit training step on this CPU: torch's own matmul kernels against ladder's fp32 ones.

Where torch has no bf16 (fp16) GEMM kernels for the CPU, a rank computes its 16-bit matmuls
in fp32 and rounds each result once (runner/hardware/cpu_half_matmul.py). This times the tiny model's
forward and backward at micro 4 x 64 tokens on one thread, fp32 and each 16-bit dtype, the
16-bit ones both ways, alternating rounds so the machine's drift hits every column alike; it
prints the median milliseconds, the loss each way, and the last line
``ratio=<bf16 with fp32 matmuls / bf16 on torch's kernels>`` (below 1: faster). Where the CPU
has the kernels, a run leaves torch's alone, and so does this (the two columns are the same).

    python bench/half_matmul_step_speed.py [--rounds 5] [--d-model 256]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.config import ModelConfig, Precision
from runner.hardware.cpu_half_matmul import computes_in_fp32, half_matmuls_in_fp32
from runner.model.transformer import Transformer, lm_loss

DTYPES = {precision.value: precision.torch_dtype for precision in Precision}


def _step(d_model: int, dtype: torch.dtype) -> Callable[[], float]:
    """One forward and backward of tiny (4 layers, d_model wide) in ``dtype``; returns the loss."""
    config = ModelConfig(
        name="tiny",
        n_layer=4,
        n_head=4,
        d_model=d_model,
        ffn_hidden=d_model * 43 // 16,
        vocab_size=256,
        max_seq_len=64,
        tie_embeddings=True,
    )
    model = Transformer(config, seed=0).to(dtype)
    data = torch.Generator().manual_seed(0)
    inputs, targets = (torch.randint(0, 256, (4, 64), generator=data) for _ in range(2))

    def step() -> float:
        model.zero_grad(set_to_none=True)
        loss = lm_loss(model(inputs), targets)
        loss.backward()
        return float(loss.detach())

    return step


def _time(step: Callable[[], float], widened: bool, dtype: torch.dtype) -> tuple[float, float]:
    """Milliseconds of one step (after a warm-up) and its loss, with or without fp32 matmuls."""
    context = half_matmuls_in_fp32(dtype) if widened else contextlib.nullcontext(False)
    with context:
        step()
        start = time.perf_counter()
        loss = step()
    return (time.perf_counter() - start) * 1e3, loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    columns = [("fp32", False), ("bf16", False), ("bf16", True), ("fp16", False), ("fp16", True)]
    steps = {name: _step(args.d_model, DTYPES[name]) for name in DTYPES}
    times: dict[tuple[str, bool], list[float]] = {column: [] for column in columns}
    losses: dict[tuple[str, bool], float] = {}
    for _ in range(args.rounds):
        for name, widened in columns:
            ms, losses[(name, widened)] = _time(steps[name], widened, DTYPES[name])
            times[(name, widened)].append(ms)
    shape = f"tiny at d_model {args.d_model}, micro 4 x 64 tokens, 1 thread"
    print(f"{shape}, forward + backward, median of {args.rounds} rounds")
    print(f"{'dtype':6} {'matmuls':26} {'median ms':>10} {'loss':>9}")
    for name, widened in columns:
        dtype = DTYPES[name]
        how = "fp32, rounded (ladder)" if widened and computes_in_fp32(dtype) else "torch's kernels"
        median = statistics.median(times[(name, widened)])
        print(f"{name:6} {how:26} {median:10.1f} {losses[(name, widened)]:9.5f}")
    medians = {column: statistics.median(found) for column, found in times.items()}
    print(f"bf16 with fp32 matmuls vs fp32: {medians[('bf16', True)] / medians[('fp32', False)]:.2f}x")
    print(f"ratio={medians[('bf16', True)] / medians[('bf16', False)]:.3f}")


if __name__ == "__main__":
    main()
