"""ZeRO's optimizer step as DeepSpeed runs it beside ladder's, which skips three gradient copies.

runner/engine/lean_zero_step.py takes the clip's fp64 norm in chunks, writes the fp32
gradient partition in one pass and hands the clip factor to torch's fused AdamW. This times
both steps on the same model, one rank (the CUDA device where there is one, else the CPU),
alternating rounds in one process per ZeRO stage (the two engines start from the same
weights and see the same batches):

    PYTHONPATH=. python bench/lean_zero_step_speed.py [--model gpt2_124m] [--stages 1,2,3]
        [--precision bf16] [--micro 1] [--seq 128] [--rounds 4] [--steps 3] [--device cpu]

Each round runs ``--steps`` steps of each engine, the two taking turns step by step (who goes
first flips every round); a round's figure is the median of its steps. Printed per stage:
the optimizer phase (``engine.step`` at the boundary) and the whole step, the median over
rounds with the spread (max/min - 1), and the optimizer phase's share of the step. The last
line is ``opt_ratio=`` (ladder's optimizer phase over DeepSpeed's) per stage.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

MASTER_PORT = 29671


def _engine(model: Any, stage: int, precision: str, micro: int, *, lean: bool) -> Any:
    """DeepSpeed's engine from ladder's own config, with ladder's step (``lean``) or DeepSpeed's."""
    import deepspeed

    from runner.config import OptimizerConfig, ParallelConfig, Precision, PrecisionConfig
    from runner.engine import lean_zero_step
    from runner.engine.deepspeed_config import build_deepspeed_config
    from runner.layout import resolve_layout
    from runner.model.transformer import build_model

    config = build_deepspeed_config(
        layout=resolve_layout(gpus=1, tp=1, pp=1, global_size=micro, micro_size=micro),
        model=model,
        parallel=ParallelConfig(name=f"zero{stage}", zero_stage=stage),
        precision=PrecisionConfig(name=Precision(precision)),
        optimizer=OptimizerConfig(),
        lr=1e-4,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    net = build_model(model, dtype=dtype)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=list(net.parameters()), config=config)
    if lean:
        lean_zero_step.install(engine)
    return engine


def _now(device: torch.device) -> float:
    """The clock once the device has done what was queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _timed_step(engine: Any, tokens: torch.Tensor) -> tuple[float, float]:
    """One optimizer step's optimizer-phase and whole-step seconds."""
    from runner.model.transformer import lm_loss

    device = engine.device
    tokens = tokens.to(device)
    start = _now(device)
    engine.backward(lm_loss(engine(tokens[:, :-1]), tokens[:, 1:]))
    boundary = _now(device)
    engine.step()
    end = _now(device)
    return end - boundary, end - start


def one_stage(args: argparse.Namespace, stage: int) -> dict[str, Any]:
    """Both engines of one stage, alternating rounds: each variant's per-round figures."""
    import deepspeed

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from step_peak import model_config

    deepspeed.init_distributed(dist_backend="nccl" if args.device == "cuda" else "gloo")
    model = model_config(args.model)
    engines = {
        name: _engine(model, stage, args.precision, args.micro, lean=name == "ladder")
        for name in ("deepspeed", "ladder")
    }
    generator = torch.Generator().manual_seed(0)

    def batch() -> torch.Tensor:
        return torch.randint(0, model.vocab_size, (args.micro, args.seq + 1), generator=generator)

    first = batch()
    for engine in engines.values():  # the first step makes the optimizer's states
        _timed_step(engine, first)
    # Step by step, the two engines take turns (the order flips every round), so both meet the
    # host in the same state: a CPU's cost of fresh pages drifts over minutes.
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for index in range(args.rounds):
        order = list(engines) if index % 2 == 0 else list(engines)[::-1]
        steps: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
        for _ in range(args.steps):
            tokens = batch()
            for name in order:
                steps[name].append(_timed_step(engines[name], tokens))
        for name, timed in steps.items():
            rounds[name].append(
                (statistics.median(t[0] for t in timed), statistics.median(t[1] for t in timed))
            )
    return rounds


def _median_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values) / min(values) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2_124m")
    parser.add_argument("--stages", default="1,2,3")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--micro", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one stage, in a child process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_stage(args, args.one)))
        return
    print(
        f"{args.model} {args.precision}, one {args.device} rank, micro {args.micro} x seq {args.seq}, "
        f"{args.rounds} alternating rounds of {args.steps} steps (median; spread = max/min - 1)"
    )
    print(
        f"{'zero':>4} {'step as':<10}{'optimizer s':>12}{'spread':>8}"
        f"{'step s':>9}{'spread':>8}{'opt share':>10}"
    )
    ratios = []
    for stage in (int(s) for s in args.stages.split(",")):
        env = {
            **os.environ,
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(MASTER_PORT + stage),
            "DS_ACCELERATOR": args.device,
        }
        child = [
            sys.executable,
            __file__,
            f"--one={stage}",
            f"--model={args.model}",
            f"--precision={args.precision}",
            f"--micro={args.micro}",
            f"--seq={args.seq}",
            f"--rounds={args.rounds}",
            f"--steps={args.steps}",
            f"--device={args.device}",
        ]
        done = subprocess.run(child, capture_output=True, text=True, env=env)
        if done.returncode:
            sys.exit(f"zero{stage} failed:\n{done.stderr[-3000:]}")
        rounds = json.loads(done.stdout.strip().splitlines()[-1])
        medians = {}
        for name, figures in rounds.items():
            opt, opt_spread = _median_spread([f[0] for f in figures])
            step, step_spread = _median_spread([f[1] for f in figures])
            medians[name] = opt
            print(
                f"{stage:>4} {name:<10}{opt:>12.4f}{opt_spread:>8.0%}"
                f"{step:>9.3f}{step_spread:>8.0%}{opt / step:>10.1%}"
            )
        ratios.append(f"zero{stage}={medians['ladder'] / medians['deepspeed']:.3f}")
    print("opt_ratio " + " ".join(ratios))


if __name__ == "__main__":
    main()
