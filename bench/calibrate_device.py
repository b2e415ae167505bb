"""What this device reaches on a training step's own work, written as a calibration record of the
step-time model (runner/step_time/measured/figures.py ``Calibration.to_json()``'s format), with where
and when.

Every figure runner/step_time/calibrated_terms.py and micro_batch_compute.py ask for, measured with
runner/hardware/calibrate.py's micro-benchmarks at the shapes the models' runs use:

- ``gemms``: each linear layer of one transformer block and the output head (q, k, v, o, SwiGLU's
  w1/w3/w2, head; no tensor parallelism) at M = micro x seq tokens for each micro-batch size,
  forward, input- and weight-gradient FLOP/s. On CUDA at the full shape (calibrate.py's
  ``max_flops`` halving is for a CPU's seconds; on a GPU a small GEMM is launch-bound).
- ``attention``: causal SDPA forward and backward seconds at (micro, heads, seq, head_dim).
- ``copies``: a copy's bytes read plus written per second at powers of two (the step model asks
  for the power of two nearest each memory-bound kernel's bytes).
- ``adamw``: fused AdamW bytes per second (28 B a parameter); the step model asks at the power of
  two nearest the rank's parameters, at most 2^25 (runner/step_time/measured/figures.py ``adamw_rate``).
- ``op_s``: one eager op's dispatch, forward and backward.
- ``fresh_bytes_per_s``: a CPU's page faults into fresh large tensors (None on CUDA).
- ``allreduce``, ``allgather``: two processes' gloo all-reduce and all-gather on a CPU; None on
  one GPU (its links are the cluster's).
- ``engine_param_s``: DeepSpeed's engine over a bare loop per parameter tensor and micro-batch,
  by ZeRO stage, and stage 3 with every tensor persistent (runner/step_time/measured/zero3_overhead.py,
  DeepSpeed in a child process), where that module exists.
- ``zero3_hook_s``, ``zero3_gather_s`` (:func:`zero3_figures`): ZeRO-3's hooks per tensor visited
  (all-persistent stage 3 less stage 0) and a gather's own cost per gathered tensor (stage 3 less
  all-persistent stage 3), from the same child.
- ``sources`` (:func:`figure_sources`): the micro-benchmark behind each figure, in words.

    python bench/calibrate_device.py [--out calibration.json] [--cluster NAME]
        [--models llama_1b,llama_7b] [--micro 1,2,4,8] [--seq 2048]

``--cluster NAME`` writes conf/cluster/calibration/NAME.json, the named cluster's file that
``cluster=NAME`` plans with; ``--out`` (default calibration.json when no cluster is named) writes
the same record there too. On CUDA (bf16, llama_1b and llama_7b at seq 2048) it takes well under
a minute on an H200, most of it ZeRO-3's child process; without CUDA it measures the tiny
model's shapes in fp32 at seq 128 in a few seconds (plus the all-reduce's and ZeRO-3's child
processes).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.config import ModelConfig  # noqa: E402
from runner.hardware import calibrate  # noqa: E402
from runner.step_time.measured.block_timing import cross_entropy_seconds, rest_seconds  # noqa: E402
from runner.step_time.measured.figures import cluster_file, floor_shape, from_record  # noqa: E402


def _model(name: str) -> ModelConfig:
    """conf/model/<name>.yaml as plain YAML onto ModelConfig (the schema's defaults for the rest)."""
    import yaml

    fields = yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())
    return ModelConfig(**fields)


def block_gemms(cfg: ModelConfig, tokens: int) -> dict[str, tuple[int, int, int]]:
    """(M, K, N) of each matmul in one block's forward and the output head, M = tokens.

    runner/step_time/micro_batch_compute.py ``_gemm_shapes`` at tp = 1 (runner/model/transformer.py): q, k, v
    projections (k and v with n_kv_head heads), the output projection, SwiGLU's w1 and w3
    (d_model -> ffn_hidden) and w2 (ffn_hidden -> d_model), the head (d_model -> vocab).
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


def _key(*numbers: int) -> str:
    """A figure's key in the record (runner/step_time/measured/figures.py ``_key``): "m,k,n", "b,h,s,d",
    "bytes"."""
    return ",".join(str(int(n)) for n in numbers)


def _engine_param_seconds(device: torch.device) -> dict[str, float] | None:
    """runner/step_time/measured/zero3_overhead.py's figures, None where that module is not (yet) in
    the tree."""
    if importlib.util.find_spec("runner.step_time.measured.zero3_overhead") is None:
        print(
            "engine_param_s: runner/step_time/measured/zero3_overhead.py is not here; left None", flush=True
        )
        return None
    from runner.step_time.measured import zero3_overhead as calibrate_zero3

    threads = None if device.type == "cuda" else torch.get_num_threads()
    return calibrate_zero3.engine_param_seconds(device_type=device.type, threads=threads)


def zero3_figures(engine: dict[str, float] | None) -> dict[str, float | None]:
    """ZeRO-3's two per-tensor figures from runner/step_time/measured/zero3_overhead.py's micro-benchmark
    (DeepSpeed, one rank, this device): its hooks per tensor visited (stage 3 with every tensor
    persistent less stage 0) and a gather's own cost per gathered tensor (stage 3 less the
    all-persistent run); None where the child did not measure them."""
    from runner.step_time.measured import zero3_overhead as calibrate_zero3

    engine = engine or {}
    persistent = engine.get(calibrate_zero3.PERSISTENT_KEY)
    if persistent is None or "0" not in engine or "3" not in engine:
        return {"zero3_hook_s": None, "zero3_gather_s": None}
    return {
        "zero3_hook_s": max(0.0, persistent - engine["0"]),
        "zero3_gather_s": max(0.0, engine["3"] - persistent),
    }


def figure_sources(figures: dict[str, Any]) -> dict[str, str]:
    """The micro-benchmark that measured each figure of the record (runner/step_time/measured/figures.py
    ``Calibration.sources``), and why a figure left None is."""
    here = "bench/calibrate_device.py measure: runner/hardware/calibrate.py"
    rest = "one block's non-GEMM part forward and backward at each micro-batch and its trivial shape"
    zero3 = (
        "bench/calibrate_device.py zero3_figures: "
        "runner/step_time/measured/zero3_overhead.py engine_param_seconds"
    )
    timing = "bench/calibrate_device.py _rest_figures: runner/step_time/measured/block_timing.py"
    measured = {
        "gemms": f"{here} gemm_rates (forward, dX, dW) at each GEMM of a block and the head",
        "attention": f"{here} attention_seconds, causal SDPA forward and backward",
        "copies": f"{here} copy_rate, bytes read + written per s at powers of two",
        "adamw": f"{here} adamw_rate, fused AdamW (28 B a parameter)",
        "op_s": f"{here} op_seconds, one eager op forward and backward",
        "fresh_bytes_per_s": f"{here} fresh_rate, zeroing fresh large CPU tensors",
        "allreduce": f"{here} allreduce_costs, two gloo processes",
        "allgather": f"{here} allgather_costs, two gloo processes",
        "engine_param_s": (
            "bench/calibrate_device.py: runner/step_time/measured/zero3_overhead.py engine_param_seconds, "
            "each ZeRO stage's micro-step less a bare loop's per tensor (DeepSpeed, one rank)"
        ),
        "zero3_hook_s": f"{zero3}, stage 3 with every tensor persistent less stage 0, per tensor visited",
        "zero3_gather_s": f"{zero3}, stage 3 less stage 3 with every tensor persistent, per gathered tensor",
        "rest": f"{timing} rest_seconds, {rest}",
        "rest_compiled": f"{timing} rest_seconds, {rest}, under torch.compile",
        "cross_entropy": f"{timing} cross_entropy_seconds, the loss forward and backward at (tokens, vocab)",
    }
    return {
        name: words if figures.get(name) not in (None, {}) else f"not measured on this device ({words})"
        for name, words in measured.items()
    }


def _rest_figures(
    cfg: ModelConfig,
    micros: list[int],
    seq: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    timed: Callable[[str, Callable[[], Any]], Any],
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """One block's non-GEMM part (runner/step_time/measured/block_timing.py ``rest_seconds``) at each
    micro-batch and at its dispatch floor's trivial shape (runner/step_time/measured/figures.py
    ``floor_shape``), eager, and compiled on CUDA at the floor and the largest micro-batch
    (torch.compile takes a minute a shape on a CPU: its mode records eager only); the
    cross-entropy over (micro x seq, vocab)."""
    import dataclasses

    from runner.model.shape import n_kv_head

    kinds = ["rest", "rest_compiled"] if device.type == "cuda" else ["rest"]
    rest: dict[str, dict[str, float]] = {kind: {} for kind in kinds}
    heads, kv = cfg.n_head, n_kv_head(cfg)
    floor = floor_shape(heads, kv)
    shapes = [floor] + [(micro, seq, cfg.d_model, heads, kv, cfg.ffn_hidden) for micro in micros]
    for kind in kinds:
        # Compiling is paid per shape (tens of seconds on a GPU): the compiled part is measured
        # at the floor and the largest micro-batch only; the plan reads the nearest shape.
        at = shapes if kind == "rest" else [floor, shapes[-1]]
        for shape in at:
            micro, at_seq, d, h, k, f = shape
            block = ModelConfig(name="block", n_layer=1, n_head=h, n_kv_head=k, d_model=d, ffn_hidden=f)
            block = dataclasses.replace(block, max_seq_len=max(at_seq, 8))
            rest[kind][_key(*shape)] = timed(
                kind,
                functools.partial(
                    rest_seconds, block, micro, at_seq, dtype=dtype, device=device, compiled=kind != "rest"
                ),
            )
    loss = {
        _key(micro * seq, cfg.vocab_size): timed(
            "cross_entropy",
            functools.partial(cross_entropy_seconds, micro * seq, cfg.vocab_size, dtype=dtype, device=device),
        )
        for micro in micros
    }
    return rest, {"cross_entropy": loss}


def measure(
    *, models: list[str], micros: list[int], seq: int, dtype: torch.dtype, device: torch.device
) -> tuple[dict[str, Any], dict[str, float]]:
    """The record's figures, and the seconds each kind took to measure."""
    cuda = device.type == "cuda"
    max_flops = float("inf") if cuda else calibrate.MAX_GEMM_FLOPS
    spent: dict[str, float] = {}

    def timed(kind: str, fn: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        value = fn()
        spent[kind] = spent.get(kind, 0.0) + time.perf_counter() - started
        return value

    gemms: dict[str, list[float]] = {}
    attention: dict[str, list[float]] = {}
    rests: dict[str, dict[str, float]] = {"rest": {}, "rest_compiled": {}}
    losses: dict[str, dict[str, float]] = {"cross_entropy": {}}
    for name in models:
        cfg = _model(name)
        head_dim = cfg.d_model // cfg.n_head
        for micro in micros:
            for m, k, n in block_gemms(cfg, micro * seq).values():
                if _key(m, k, n) not in gemms:  # w1 and w3 share a shape, so do wk and wv
                    rates = timed(
                        "gemms",
                        functools.partial(
                            calibrate.gemm_rates, m, k, n, dtype=dtype, device=device, max_flops=max_flops
                        ),
                    )
                    gemms[_key(m, k, n)] = list(rates)
            shape = (micro, cfg.n_head, seq, head_dim)
            if _key(*shape) not in attention:
                seconds = timed(
                    "attention",
                    functools.partial(calibrate.attention_seconds, *shape, dtype=dtype, device=device),
                )
                attention[_key(*shape)] = list(seconds)
        rest, loss = _rest_figures(cfg, micros, seq, dtype=dtype, device=device, timed=timed)
        for table, figures_ in ((rests, rest), (losses, loss)):
            for key, value in figures_.items():
                table.setdefault(key, {}).update(value)
        print(f"{name}: gemms, attention, non-GEMM parts and cross-entropy measured", flush=True)
    copy_sizes = [2**p for p in range(16, 33)] if cuda else [2**p for p in range(12, 25, 2)]
    copies = {
        _key(size): timed("copies", functools.partial(calibrate.copy_rate, size, device=device))
        for size in copy_sizes
    }
    adamw_sizes = (2**25, 2**26) if cuda else (2**20, 2**22)
    adamw = {
        _key(size): timed("adamw", functools.partial(calibrate.adamw_rate, size, device=device))
        for size in adamw_sizes
    }
    figures: dict[str, Any] = {
        "gemms": gemms,
        "attention": attention,
        "copies": copies,
        "adamw": adamw,
        **rests,
        **losses,
        "op_s": timed("op_s", lambda: calibrate.op_seconds(device=device)),
        "fresh_bytes_per_s": timed("fresh", lambda: calibrate.fresh_rate(device=device)),
        # one GPU has no peer to reduce with: its links are the cluster's (conf/cluster/*.yaml)
        "allreduce": None if cuda else timed("allreduce", lambda: list(calibrate.allreduce_costs())),
        "allgather": None if cuda else timed("allgather", lambda: list(calibrate.allgather_costs())),
        "engine_param_s": timed("engine", lambda: _engine_param_seconds(device)),
    }
    figures.update(zero3_figures(figures["engine_param_s"]))
    return figures, spent


def _print(record: dict[str, Any]) -> None:
    print(f"{'gemm M, K, N':<24}{'fwd':>8}  {'dX':>8}  {'dW':>8}  TFLOP/s")
    for key, rates in record["gemms"].items():
        print(f"{key:<24}" + "  ".join(f"{rate / 1e12:8.2f}" for rate in rates))
    print(f"{'attention b, h, s, d':<24}{'fwd ms':>8}  {'bwd ms':>8}")
    for key, (forward, backward) in record["attention"].items():
        print(f"{key:<24}{1e3 * forward:8.3f}  {1e3 * backward:8.3f}")
    print(
        "copy GB/s: "
        + ", ".join(f"2^{int(k).bit_length() - 1} {v / 1e9:.0f}" for k, v in record["copies"].items())
    )
    print(
        "fused AdamW GB/s: "
        + ", ".join(f"2^{int(k).bit_length() - 1} {v / 1e9:.0f}" for k, v in record["adamw"].items())
    )
    fresh, engine = record["fresh_bytes_per_s"], record.get("engine_param_s") or {}
    hook, gather = record.get("zero3_hook_s"), record.get("zero3_gather_s")
    print(
        f"op {1e6 * record['op_s']:.1f} us; fresh memory "
        + ("-" if fresh is None else f"{fresh / 1e9:.1f} GB/s")
        + f"; all-reduce {record['allreduce'] or '-'}; ZeRO-3 hooks "
        + ("-" if hook is None else f"{1e3 * hook:.3f} ms a param tensor visited")
        + ", gather "
        + ("-" if gather is None else f"{1e3 * gather:.3f} ms a gathered tensor")
        + "; engine by stage "
        + (", ".join(f"{stage} {1e3 * value:.3f} ms" for stage, value in engine.items()) or "-")
    )


def main() -> None:
    """Measure and write the calibration record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default=None, help="the record's path (default calibration.json, no --cluster)"
    )
    parser.add_argument("--cluster", default=None, help="write conf/cluster/calibration/CLUSTER.json")
    parser.add_argument("--models", default=None, help="comma-separated conf/model options")
    parser.add_argument("--micro", default="1,2,4,8", help="comma-separated micro-batch sizes")
    parser.add_argument("--seq", type=int, default=None)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    models = (args.models or ("llama_1b,llama_7b" if cuda else "tiny")).split(",")
    micros = [int(m) for m in args.micro.split(",")]
    seq = args.seq or (2048 if cuda else 128)
    name = torch.cuda.get_device_name(0) if cuda else f"cpu {platform.machine()}, {os.cpu_count()} cores"
    started = time.perf_counter()
    measured = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    figures, spent = measure(models=models, micros=micros, seq=seq, dtype=dtype, device=device)
    raw = {
        "device": name,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": 0
        if cuda
        else torch.get_num_threads(),  # 0: not a CPU (runner/step_time/measured/figures.py)
        "torch": torch.__version__,
        "measured": measured,
        "where": (
            f"{platform.node()}: {name}, bench/calibrate_device.py --models {','.join(models)} "
            f"--micro {args.micro} --seq {seq}"
        ),
        **figures,
    }
    # The loader's own round trip, so the file holds exactly what Calibration.to_json() writes
    # (and what load_cluster reads back); a field an older calibration.py lacks is kept as measured.
    raw["sources"] = figure_sources(raw)
    record = {**raw, **from_record(raw, source="").to_json()}
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    paths = [Path(args.out or "calibration.json")] if args.out or not args.cluster else []
    if args.cluster:
        paths.append(cluster_file(args.cluster))
    _print(record)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"calibration: {path}")
    took = ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in spent.items())
    print(f"measured in {time.perf_counter() - started:.1f} s ({took})")


if __name__ == "__main__":
    main()
