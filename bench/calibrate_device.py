"""What this device reaches on a training step's own work: GEMMs at a model's shapes, a copy,
the fused AdamW step; raw figures for a step-time model, written as JSON with where and when.

For each model, every matmul of one transformer block and of the output head at the batch's
tokens (micro x seq), forward and the two backward GEMMs, timed in the run's precision:
achieved TFLOP/s per shape, and the FLOP-weighted efficiency against the device's dense
datasheet peak. Then the memory bandwidth of a large copy (bytes read + written per second),
and torch's fused AdamW on a flat fp32 tensor (bytes the step moves per second: p, g, m, v
read; p, m, v written, 28 bytes a parameter).

    python bench/calibrate_device.py [--out calibration.json] [--models llama_1b,llama_7b]

Without CUDA it measures the tiny model's shapes in fp32, in a few seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.config import ModelConfig  # noqa: E402


def _model(name: str) -> ModelConfig:
    """conf/model/<name>.yaml as plain YAML onto ModelConfig (the schema's defaults for the rest)."""
    import yaml

    fields = yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())
    return ModelConfig(**fields)


def _timed(fn: Any, *, repeats: int, cuda: bool) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after two warm-up calls."""
    times = []
    for index in range(repeats + 2):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        if index >= 2:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def block_gemms(cfg: ModelConfig, tokens: int) -> dict[str, tuple[int, int, int]]:
    """(M, K, N) of each matmul in one block's forward and the output head, M = tokens.

    runner/model/transformer.py: q, k, v projections (k and v with n_kv_head heads), the output
    projection, SwiGLU's w1 and w3 (d_model -> ffn_hidden) and w2 (ffn_hidden -> d_model).
    """
    h, f = cfg.d_model, cfg.ffn_hidden
    kv = h * (cfg.n_kv_head or cfg.n_head) // cfg.n_head
    return {
        "wq": (tokens, h, h),
        "wk": (tokens, h, kv),
        "wv": (tokens, h, kv),
        "wo": (tokens, h, h),
        "w1": (tokens, h, f),
        "w3": (tokens, h, f),
        "w2": (tokens, f, h),
        "head": (tokens, h, cfg.vocab_size),
    }


def gemm_rates(cfg: ModelConfig, tokens: int, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """Achieved FLOP/s of each shape: forward (x @ W), and backward's dX = dY @ W^T, dW = X^T @ dY."""
    cuda = device.type == "cuda"
    rows = {}
    for name, (m, k, n) in block_gemms(cfg, tokens).items():
        x = torch.randn(m, k, dtype=dtype, device=device)
        w = torch.randn(k, n, dtype=dtype, device=device)
        dy = torch.randn(m, n, dtype=dtype, device=device)
        repeats = 10 if cuda else 3
        forward = _timed(lambda x=x, w=w: x @ w, repeats=repeats, cuda=cuda)
        grad_input = _timed(lambda dy=dy, w=w: dy @ w.T, repeats=repeats, cuda=cuda)
        grad_weight = _timed(lambda x=x, dy=dy: x.T @ dy, repeats=repeats, cuda=cuda)
        flops = 2 * m * k * n
        rows[name] = {
            "mkn": [m, k, n],
            "forward_flops_per_s": flops / forward,
            "grad_input_flops_per_s": flops / grad_input,
            "grad_weight_flops_per_s": flops / grad_weight,
        }
        del x, w, dy
    return rows


def copy_bandwidth(device: torch.device, num_bytes: int) -> float:
    """Bytes read plus written per second by a contiguous copy of ``num_bytes``."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _timed(lambda: dst.copy_(src), repeats=10, cuda=device.type == "cuda")
    return 2 * num_bytes / seconds


def adamw_bandwidth(device: torch.device, numel: int) -> float:
    """Bytes per second torch's fused AdamW moves on a flat fp32 parameter (28 bytes an element)."""
    param = torch.zeros(numel, dtype=torch.float32, device=device, requires_grad=True)
    param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW([param], lr=1e-4, fused=True)
    seconds = _timed(optimizer.step, repeats=10, cuda=device.type == "cuda")
    return 28 * numel / seconds


def main() -> None:
    """Measure and write the calibration record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="calibration.json")
    parser.add_argument("--models", default=None, help="comma-separated conf/model options")
    parser.add_argument("--micro", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    models = (args.models or ("llama_1b,llama_7b" if cuda else "tiny")).split(",")
    micro, seq = args.micro or 8, args.seq or (2048 if cuda else 128)
    record: dict[str, Any] = {
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "tokens": micro * seq,
        "gemms": {},
    }
    for name in models:
        record["gemms"][name] = gemm_rates(_model(name), micro * seq, dtype, device)
        print(f"{name}: done", flush=True)
    size = 4 * 2**30 if cuda else 256 * 2**20
    record["copy_bytes_per_s"] = copy_bandwidth(device, size)
    record["adamw_fused_bytes_per_s"] = adamw_bandwidth(device, (2**28 if cuda else 2**22))
    Path(args.out).write_text(json.dumps(record, indent=1))
    kinds = ("forward_flops_per_s", "grad_input_flops_per_s", "grad_weight_flops_per_s")
    print(f"{'model':<10}{'gemm':<6}{'M, K, N':<24}{'fwd':>8}  {'dX':>8}  {'dW':>8}  TFLOP/s")
    for name, rows in record["gemms"].items():
        for shape, row in rows.items():
            rates = "  ".join(f"{row[kind] / 1e12:8.1f}" for kind in kinds)
            print(f"{name:<10}{shape:<6}{row['mkn']!s:<24}{rates}")
    copy, adamw = record["copy_bytes_per_s"] / 1e9, record["adamw_fused_bytes_per_s"] / 1e9
    print(f"copy {copy:.0f} GB/s; fused AdamW {adamw:.0f} GB/s")


if __name__ == "__main__":
    main()
