"""The peak of a run's tensor memory, measured, against ``plan=true``'s peak: one table, one run.

``plan=true`` (runner/memory_model/peak.py) adds up the bytes a device holds at the step's
peak: the weights, gradients and optimizer states, the activations, and DeepSpeed's
residual lines, among them what comes and goes inside backward (ZeRO 1-2's gradient
bucket, a tied output head's gradient). This measures the same peak on one CPU rank the
way a GPU's allocator sees it (``torch.cuda.max_memory_allocated``), where the CPU's RSS
hides it: every allocation and free from before the model is built to the end of the
second step, in order, from torch.profiler's memory events; the peak is the largest sum.

    python bench/step_peak.py [--models gpt2_124m,tiny] [--stages 0,1,2,3] [--accum 1,2]
        [--precision fp32,bf16] [--set model.vocab_size=32000 ...]

Each case: the model built by runner.model.transformer, DeepSpeed's engine from ladder's own config
(runner.engine.deepspeed_config), AdamW in fp32 (or ``--precision bf16``), micro 8, seq 128 (``--micro``,
``--seq``),
two optimizer steps (the first allocates the optimizer's states). The last line is ``max_rel_error=<x>``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import torch

from runner.config import (
    ModelConfig,
    OptimizerConfig,
    OptimizerName,
    ParallelConfig,
    ParallelSpec,
    Precision,
    PrecisionConfig,
    ZeroStage,
)
from runner.engine import lean_zero_step
from runner.engine.deepspeed_config import build_deepspeed_config, reduce_bucket_elements
from runner.engine.distributed import skip_inference_shm_op
from runner.layout import resolve_layout
from runner.memory_model.case import MemoryCase
from runner.memory_model.peak import memory_terms
from runner.memory_model.peak_lines import TIED_HEAD_GRADIENT
from runner.model.transformer import build_model, lm_loss
from runner.parallel.pipeline import build_pipeline


@dataclass(frozen=True)
class Shape:
    """Sequences per micro-batch, tokens per sequence, micro-batches per step."""

    micro: int
    seq: int
    accum: int


IN_BACKWARD = ("reduce_bucket (in backward)", TIED_HEAD_GRADIENT)
ROOT = Path(__file__).resolve().parents[1]


def model_config(name: str, overrides: tuple[str, ...] = ()) -> ModelConfig:
    """The model group ``model=<name>`` as train.py composes it (conf/, through Hydra), with ``overrides``."""
    from hydra import compose, initialize_config_dir

    from launchers.compose import register_configs, to_train_config

    register_configs()
    conf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf")
    with initialize_config_dir(config_dir=os.path.normpath(conf), version_base="1.3"):
        return to_train_config(compose(config_name="config", overrides=[f"model={name}", *overrides])).model


def _steps(engine: Any, model: ModelConfig, shape: Shape, *, pipeline: bool) -> None:
    """Two optimizer steps of random tokens: the plain loop, or DeepSpeed's pipeline schedule."""
    for _ in range(2):
        batches = []
        for _ in range(shape.accum):
            tokens = torch.randint(0, model.vocab_size, (shape.micro, shape.seq + 1))
            batches.append((tokens[:, :-1], tokens[:, 1:]))
        if pipeline:
            engine.train_batch(data_iter=iter(batches))
            continue
        for inputs, targets in batches:
            engine.backward(lm_loss(engine(inputs), targets))
            engine.step()


def measured_peak(model: ModelConfig, config: dict, shape: Shape, dtype: torch.dtype, *, pp: int) -> int:
    """The most tensor bytes live at once on this rank, from building the model to two steps' end."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        torch.manual_seed(0)
        net = build_pipeline(model, pp=pp, seed=0, dtype=dtype) if pp > 1 else build_model(model, dtype=dtype)
        engine, *_ = deepspeed.initialize(model=net, model_parameters=list(net.parameters()), config=config)
        lean_zero_step.install(engine)  # ladder's ZeRO step, as runner/engine/initialize.py builds it
        _steps(engine, model, shape, pipeline=pp > 1)
        del engine, net
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()  # negative for a free
        peak = max(peak, live)
    return peak


def planned(
    model: ModelConfig, *, precision: str, stage: int, shape: Shape, pp: int, bucket: int
) -> tuple[int, str]:
    """plan=true's peak bytes on the device (the fullest stage's), and its in-backward lines."""
    terms = memory_terms(
        MemoryCase(
            model=model,
            precision=Precision(precision),
            optimizer=OptimizerName.adamw,
            spec=ParallelSpec(zero_stage=ZeroStage(stage), pp=pp),
            seq_len=shape.seq,
            micro_size=shape.micro,
            dp=1,
            accum_steps=shape.accum,
            reduce_bucket_size=bucket,
        )
    )
    lines = {k: v for k, v in terms.residuals.items() if k in IN_BACKWARD}
    words = ", ".join(f"{k.split(' (')[0]} {v / 1e9:.3f}" for k, v in lines.items()) or "-"
    return terms.peak, words


def one_case(
    name: str, precision: str, stage: int, shape: Shape, pp: int, overrides: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Measure and plan one case on this rank (a fresh process: nothing of another engine is live).

    One rank, or under a pipeline one of ``pp`` ranks that torchrun started."""
    if pp == 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.setdefault("MASTER_PORT", "29643")
    skip_inference_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    model = model_config(name, overrides)
    parallel = ParallelConfig(name=f"zero{stage}", zero_stage=stage, pp=pp)
    config = build_deepspeed_config(
        layout=resolve_layout(
            gpus=pp, tp=1, pp=pp, global_size=shape.micro * shape.accum, micro_size=shape.micro
        ),
        model=model,
        parallel=parallel,
        precision=PrecisionConfig(name=Precision(precision)),
        optimizer=OptimizerConfig(),
        lr=1e-3,
    )
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    measured = measured_peak(model, config, shape, dtype, pp=pp)
    bucket = reduce_bucket_elements(parallel.reduce_bucket_size, model)  # the config's reduce bucket
    plan, lines = planned(model, precision=precision, stage=stage, shape=shape, pp=pp, bucket=bucket)
    return {"measured": measured, "planned": plan, "lines": lines}


def main() -> None:
    """Measure every case, each in a process of its own, and print the table and the worst error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2_124m,tiny")
    parser.add_argument("--stages", default="0,1,2,3")
    parser.add_argument("--accum", default="1,2")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--pp", default="1", help="pipeline stages: 1, 2 or 1,2 (2 runs ZeRO 0-1 on 2 ranks)")
    parser.add_argument("--micro", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model override")
    one = ("MODEL", "PRECISION", "STAGE", "ACCUM", "PP")
    parser.add_argument("--one", nargs=5, metavar=one, help=argparse.SUPPRESS)  # one case, in a child process
    args = parser.parse_args()
    if args.one:
        name, precision, stage, accum, pp = args.one
        shape = Shape(micro=args.micro, seq=args.seq, accum=int(accum))
        print(json.dumps(one_case(name, precision, int(stage), shape, int(pp), tuple(args.set))))
        return
    cases = [
        (name, precision, stage, accum, pp)
        for name in args.models.split(",")
        for precision in args.precision.split(",")
        for pp in args.pp.split(",")
        for stage in args.stages.split(",")
        for accum in args.accum.split(",")
        if pp == "1" or stage in ("0", "1")  # DeepSpeed's pipeline engine takes ZeRO 0-1
    ]
    head = f"{'model':<10}{'prec':>5}{'pp':>3}{'zero':>5}{'accum':>6}"
    head += f"{'measured GB':>13}{'planned GB':>12}{'ratio':>7}"
    print(f"{head}  in-backward lines (GB)")
    worst = 0.0
    for index, (name, precision, stage, accum, pp) in enumerate(cases):
        port = str(29643 + index)
        one_rank = [sys.executable]
        ranks = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={pp}"]
        ranks.append(f"--master_port={port}")
        case = ["--one", name, precision, stage, accum, pp, f"--micro={args.micro}", f"--seq={args.seq}"]
        case += [f"--set={override}" for override in args.set]
        proc = subprocess.run(
            [*(one_rank if pp == "1" else ranks), __file__, *case],
            capture_output=True,
            text=True,
            check=True,
            # the ranks compose the run's config: the repository's hydra_plugins (the local
            # launcher) are found on their path
            env={
                **os.environ,
                "MASTER_PORT": port,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            },
        )
        # Under a pipeline each rank prints its own: the fullest one is the plan's.
        found = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        measured, plan = max(f["measured"] for f in found), found[0]["planned"]
        worst = max(worst, abs(plan - measured) / measured)
        print(
            f"{name:<10}{precision:>5}{pp:>3}{stage:>5}{accum:>6}{measured / 1e9:>13.4f}{plan / 1e9:>12.4f}"
            f"{plan / measured:>7.3f}  {found[0]['lines']}",
            flush=True,
        )
    print(f"max_rel_error={worst:.4f}")


if __name__ == "__main__":
    main()
