"""ladder beside the plain PyTorch loop a user would write instead: tokens/s, MFU, peak memory.

The peer is a plain loop of Hugging Face transformers' ``LlamaForCausalLM`` built from
ladder's model shape (SDPA attention, weights in the run's precision, ``torch.optim.AdamW
(fused=True)``, no fp32 master copy), and the same loop around ladder's own model. ladder
runs the same batch through ``python train.py`` (ZeRO-1, one device, its fp32 master
weights). Each mode (eager; each block compiled) alternates ladder and the two loops in one
process tree, round after round, and compares median step times after warm-up. One line per
mode ends the output: ``ratio=<ladder tokens/s / transformers loop tokens/s> mode=<mode>``.

    python bench/peer_gpu.py [--rounds 1] [--steps 12] [--modes eager,compiled]

On CUDA: llama_1b in bf16, micro 8 x accum 2, seq 2048. Elsewhere: tiny in fp32, micro 8 x
accum 2, seq 128, so the script is known to work before GPU time is spent. transformers is
a bench-only requirement (``pip install transformers``; CUDA images carry it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WARMUP = 3  # steps left out of the medians: allocation, autotuning, compilation


@dataclass(frozen=True)
class Case:
    """The batch both sides train: ladder's model name, precision and batch contract."""

    model: str
    precision: str
    seq_len: int
    micro_size: int = 8
    accum_steps: int = 2

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step."""
        return self.micro_size * self.accum_steps * self.seq_len


def _case(cuda: bool) -> Case:
    return Case("llama_1b", "bf16", 2048) if cuda else Case("tiny", "fp32", 128)


def _model_config(name: str) -> Any:
    """ladder's ModelConfig for a conf/model/ option, composed as train.py composes it."""
    from hydra import compose, initialize_config_dir

    from launchers.compose import register_configs, to_train_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=[f"model={name}"])).model


def _ladder(case: Case, run_dir: Path, steps: int, compiled: bool) -> dict[str, float]:
    """One ladder run; its median step time, MFU, peak and phase shares from metrics.jsonl."""
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        f"model={case.model}",
        f"precision={case.precision}",
        "parallel=zero1",
        "gpus=1",
        f"batch.global_size={case.micro_size * case.accum_steps}",
        f"batch.micro_size={case.micro_size}",
        f"data.seq_len={case.seq_len}",
        "data=synthetic",
        "logger=none",
        "logger.progress=false",
        f"train.steps={steps}",
        f"train.compile={str(compiled).lower()}",
        f"hydra.run.dir={run_dir}",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][WARMUP:]

    def median(key: str) -> float:
        return statistics.median(float(row[key]) for row in rows)

    step_s = median("time/step_s")
    return {
        "step_s": step_s,
        "peak_gb": max(float(row["memory/peak_gb"]) for row in rows),
        **{
            f"{phase}_share": median(f"time/{phase}_s") / step_s
            for phase in ("forward", "backward", "optimizer")
        },
    }


def _peer(case: Case, kind: str, steps: int, compiled: bool, out: Path) -> dict[str, float]:
    """One plain-loop run in its own process (a fresh allocator and compile cache, as ladder's)."""
    cmd = [sys.executable, __file__, "--loop", kind, "--steps", str(steps), "--out", str(out)]
    cmd += ["--model", case.model, "--precision", case.precision, "--seq", str(case.seq_len)]
    cmd += ["--compiled"] if compiled else []
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    result: dict[str, float] = json.loads(out.read_text())
    return result


def _build_loop_model(kind: str, model_name: str, dtype: Any, device: Any) -> Any:
    """transformers' LlamaForCausalLM with ladder's shape, or ladder's own model."""
    import torch

    cfg = _model_config(model_name)
    if kind == "ladder_model":
        from runner.model.transformer import build_model

        return build_model(cfg, seed=0, device=device, dtype=dtype)
    from transformers import LlamaConfig, LlamaForCausalLM

    shape: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head or cfg.n_head,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_embeddings,
        attn_implementation="sdpa",  # torch's scaled_dot_product_attention, as ladder's model uses
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(LlamaConfig(**shape))
    return model.to(device=device, dtype=dtype)


def _blocks(model: Any) -> Any:
    return model.model.layers if hasattr(model, "model") else model.layers


def _loss(kind: str, model: Any, inputs: Any, targets: Any) -> Any:
    if kind == "ladder_model":
        from runner.model.transformer import lm_loss

        return lm_loss(model(inputs), targets)
    # transformers shifts the labels itself; a training step keeps no key/value cache.
    return model(input_ids=inputs, labels=inputs, use_cache=False).loss


def _host_peak_gb() -> float:
    """The process's high-water RSS in GB (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def run_loop(args: argparse.Namespace) -> None:
    """The plain loop: micro-batches, backward, AdamW(fused=True), zero_grad; phases timed."""
    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.precision]
    case = Case(args.model, args.precision, args.seq)
    model = _build_loop_model(args.loop, args.model, dtype, device)
    if args.compiled:
        for block in _blocks(model):
            block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    vocab = _model_config(args.model).vocab_size
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (case.micro_size, case.seq_len + 1), generator=generator).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    rows = []
    for _ in range(args.steps):
        started = now()
        forward = backward = 0.0
        for _ in range(case.accum_steps):
            mark = now()
            loss = _loss(args.loop, model, inputs, targets) / case.accum_steps
            forward += now() - mark
            mark = now()
            loss.backward()
            backward += now() - mark
        mark = now()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ended = now()
        rows.append((ended - started, forward, backward, ended - mark))
    timed = rows[WARMUP:]
    step_s = statistics.median(r[0] for r in timed)
    result = {
        "step_s": step_s,
        # ladder's own measure: CUDA's allocator peak, or on a CPU the process's high-water RSS.
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else _host_peak_gb(),
        "forward_share": statistics.median(r[1] for r in timed) / step_s,
        "backward_share": statistics.median(r[2] for r in timed) / step_s,
        "optimizer_share": statistics.median(r[3] for r in timed) / step_s,
    }
    Path(args.out).write_text(json.dumps(result))


def _mfu_per_s(case: Case, cuda: bool) -> float:
    """MFU of one step per second, by ladder's formula (runner/flops.py, PaLM appendix B)."""
    import torch

    from runner.flops import flops_per_token, non_embedding_params
    from runner.hardware.peak_flops import calibrate_cpu_peak, peak_flops_for_cuda_device
    from runner.model.shape import num_params

    cfg = _model_config(case.model)
    matmul = non_embedding_params(
        num_params(cfg), vocab_size=cfg.vocab_size, d_model=cfg.d_model, tie_embeddings=cfg.tie_embeddings
    )
    per_token = flops_per_token(
        num_params=matmul, n_layers=cfg.n_layer, d_model=cfg.d_model, seq_len=case.seq_len
    )
    if cuda:
        peak = peak_flops_for_cuda_device(torch.cuda.get_device_name(), case.precision)
    else:
        peak = calibrate_cpu_peak(torch.float32)
    return per_token * case.tokens_per_step / peak


def _table(case: Case, results: dict[str, dict[str, list[dict[str, float]]]], mfu_per_s: float) -> None:
    """One row per side and mode: the medians over rounds, and the ratio line per mode."""
    batch = f"micro {case.micro_size} x accum {case.accum_steps}, seq {case.seq_len}"
    print(f"\n{case.model} {case.precision}, {batch}")
    header = (
        f"{'mode':<10}{'side':<24}{'tokens/s':>12}{'MFU':>8}{'peak GB':>9}{'fwd/bwd/opt %':>16}{'s/step':>9}"
    )
    print(header)
    for mode, sides in results.items():
        tokens: dict[str, float] = {}
        for side, runs in sides.items():
            step_s = statistics.median(r["step_s"] for r in runs)
            tokens[side] = case.tokens_per_step / step_s
            split = " / ".join(
                f"{100 * statistics.median(r[f'{p}_share'] for r in runs):.0f}"
                for p in ("forward", "backward", "optimizer")
            )
            peak = max(r["peak_gb"] for r in runs)
            print(
                f"{mode:<10}{side:<24}{tokens[side]:>12,.0f}{100 * mfu_per_s / step_s:>7.1f}%"
                f"{peak:>9.2f}{split:>16}{step_s:>9.4f}"
            )
        spread = [case.tokens_per_step / r["step_s"] for r in sides["ladder"]]
        peers = [case.tokens_per_step / r["step_s"] for r in sides["transformers loop"]]
        ratios = [a / b for a, b in zip(spread, peers, strict=True)]
        print(f"  {mode}: ladder / transformers loop per round: " + ", ".join(f"{r:.3f}" for r in ratios))
    for mode, sides in results.items():
        ladder = statistics.median(r["step_s"] for r in sides["ladder"])
        peer = statistics.median(r["step_s"] for r in sides["transformers loop"])
        print(f"ratio={peer / ladder:.3f} mode={mode}")


def main() -> None:
    """Alternate ladder and the plain loops, mode by mode and round by round; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--out-json", default=None, help="also write every measurement here")
    # One plain-loop run (what main starts in a subprocess):
    parser.add_argument("--loop", choices=("transformers", "ladder_model"))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.loop is not None:
        run_loop(args)
        return
    import torch

    cuda = torch.cuda.is_available()
    case = _case(cuda)
    modes = [m for m in args.modes.split(",") if m]
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        m: {"ladder": [], "transformers loop": [], "ladder's model, loop": []} for m in modes
    }
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for mode in modes:
                compiled = mode == "compiled"
                where = Path(tmp) / f"{mode}{round_index}"
                results[mode]["ladder"].append(_ladder(case, where, args.steps, compiled))
                results[mode]["transformers loop"].append(
                    _peer(
                        case, "transformers", args.steps, compiled, Path(tmp) / f"hf{mode}{round_index}.json"
                    )
                )
                results[mode]["ladder's model, loop"].append(
                    _peer(
                        case, "ladder_model", args.steps, compiled, Path(tmp) / f"own{mode}{round_index}.json"
                    )
                )
                print(f"round {round_index + 1} {mode}: done", flush=True)
    if args.out_json:
        Path(args.out_json).write_text(json.dumps({"case": case.__dict__, "results": results}, indent=1))
    _table(case, results, _mfu_per_s(case, cuda))


if __name__ == "__main__":
    main()
