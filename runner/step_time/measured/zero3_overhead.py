"""DeepSpeed's host overhead per parameter tensor and micro-batch, ZeRO-3's above all, measured
with DeepSpeed itself.

ZeRO-3 gathers each partitioned parameter before its module runs and releases it after,
forward and backward, through hooks DeepSpeed puts around every module
(runtime/zero/parameter_offload.py, partitioned_param_coordinator.py), and hands each
gradient to its reduce path (runtime/zero/stage3.py ``reduce_partition_and_remove_grads``).
That bookkeeping is mostly Python on the host, paid per parameter tensor per micro-batch.
Measured here (2-core CPU, torch 2.13, DeepSpeed 0.19.8, fp32, one rank, 2 threads): about
1 ms a tensor of a small transformer block, hooks and gather together, of which the gather is
about a tenth; on a CPU that includes the slowdown ZeRO-3 brings to the rank's computation
(:func:`_measure`). Larger tensors add copies on top, per byte of parameter (:data:`BYTE_KEY`).
The collectives themselves (world size 1 here) are the step model's ``dp comm`` term.

What DeepSpeed 0.19.8 does, and so what each figure is paid by:

- per module, persistent parameters or not: four hooks (runtime/zero/parameter_offload.py
  ``_register_deepspeed_module``): the forward pre-hook (``pre_sub_module_forward_function``:
  the coordinator's ``trace_prologue`` and ``fetch_sub_module``), the forward hook
  (``_post_forward_module_hook``: ``release_sub_module``), and two ``torch.autograd.Function``
  wrappers around the module's outputs and inputs that call the same fetch and release in
  backward (``pre_sub_module_backward_function``, ``post_sub_module_backward_function``);
- per parameter tensor visited, persistent or not (runtime/zero/partitioned_param_coordinator.py):
  ``_fetch_sub_module_impl`` builds the module's parameter set, adds the module to each
  tensor's ``ds_active_sub_modules``, checks its status and, once the trace is complete, pops it
  off the prefetch queue (the trace holds persistent tensors too: ``record_parameters``);
  ``release_sub_module`` discards it again and asks ``__params_to_release``; and stage 3's
  gradient hook (runtime/zero/stage3.py ``create_reduce_and_remove_grad_hooks``,
  ``reduce_partition_and_remove_grads``) copies every gradient into the reduce bucket;
- per gathered tensor only (``ds_persist`` false): ``__all_gather_params_`` allocates the whole
  tensor and launches ``all_gather_coalesced``, the wait on its handle, and ``__release_param``'s
  ``partition`` that frees it; a persistent tensor is ``AVAILABLE`` already, so
  ``fetch_sub_module`` finds nothing to gather and ``__params_to_release`` leaves it whole.

So the child times stage 3 twice at the small width: every tensor gathered (threshold 0, "3")
and every tensor persistent (:data:`ALL_PERSISTENT`, :data:`PERSISTENT_KEY`). The persistent
run less stage 0 is the hooks, per tensor visited; "3" less the persistent run is the gather's
own cost, per gathered tensor. The stack is the runner's own TransformerBlock
(runner/model/transformer.py: 9 tensors in 12 modules), so the per-module hooks are folded into
the per-tensor figure at the ratio a real model has, around the same kernels.

:func:`engine_param_seconds` times it in a child process (the caller gets no process group
and no DeepSpeed import): one rank, world size 1, a stack of small transformer blocks,
initialized once at each ZeRO stage with the keys the runner's configs set
(runner/engine/deepspeed_config.py ``_zero_section``), and the same stack run bare. ZeRO-3's
figure is the stage-3 micro-step (forward and backward, no optimizer step) minus the stage-0
one, over the number of parameter tensors; every stage's micro-step minus the bare one, the
same way, is: the engine's own work between optimizer steps
(its forward and backward wrappers, ZeRO-1 and 2's gradient hooks), which a CPU pays in
Python per tensor (on a 2-core CPU, a few microseconds at stage 0, tens at stage 2). The fastest of a few
rounds after warm-up counts, as in runner/hardware/calibrate.py: other work on the host only
ever slows a round down.

``python -m runner.step_time.measured.zero3_overhead --device-type cpu`` runs the child's side and
prints ``{"zero3_param_s": ...}`` as its last line of stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runner.exit_codes import ExitCode
from runner.hardware.host_allocator import default_cpu_rank_env
from runner.rundir.json_types import JsonObject

REPO_ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 120.0  # the child takes about 10 s on a quiet 2-core CPU, 20-40 s on a busy one
# The stack: BLOCKS of the runner's own TransformerBlock (9 parameter tensors in 12 modules, with
# the norms, RoPE and SwiGLU between its GEMMs), so that each hook's module, its tensors and the
# compute around it are a real model's: 36 parameter tensors.
BLOCKS = 4
HEADS = 4
WIDTH = 64  # small: the GEMMs cost little beside the hooks
# ZeRO-3 timed again at this width (1 MB fp32 attention matrices) gives its cost per byte of
# parameter: the gathers' and the gradients' copies, which grow with a tensor's size.
WIDE = 512
SEQ = 128
# Elements of one activation (tokens x width) at either width: the same work for the CPU's
# threads in every elementwise kernel, so the wide stack differs from the small one in its
# tensors' bytes, not in how its activations parallelize.
ELEMENTS = 65_536
MICRO_STEPS = 1  # forward + backward per timed round: the fastest of ROUNDS of them counts
ROUNDS = 8  # timed rounds per stage, after WARMUP_ROUNDS
WARMUP_ROUNDS = 2  # ZeRO-3 traces the module order in its first micro-steps, then prefetches
MIN_ROUNDS = 3  # timed rounds before TIMING_BUDGET_S may end a group's timing
TIMING_BUDGET_S = 5.0  # per group (see :class:`_Rounds`); a quiet 2-core CPU times all ROUNDS in ~3 s
RESULT_KEY = "zero3_param_s"
ENGINE_KEY = "engine_param_s"
BYTE_KEY = "zero3_byte_s"  # in ENGINE_KEY's figures: ZeRO-3's seconds per byte of a gathered tensor
# In ENGINE_KEY's figures: stage 3 with every tensor persistent (never gathered), per tensor: the
# hooks alone (:func:`_ds_config`'s ``persistent``), against "3", where every tensor is gathered.
PERSISTENT_KEY = "3p"
ALL_PERSISTENT = 10**10  # stage3_param_persistence_threshold above every tensor: none is gathered


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child_result(device_type: str, threads: int | None) -> dict[str, Any] | None:
    """The child's result (see :func:`_measure`); None when DeepSpeed is missing, or the
    child fails or times out."""
    if importlib.util.find_spec("deepspeed") is None:
        return None
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )
    if device_type == "cpu":
        env["DS_ACCELERATOR"] = "cpu"  # chosen at DeepSpeed's import: before it
        # the malloc a CPU rank gets by default (train.host_allocator=auto): ZeRO-3's gathers
        # allocate their buffers each micro-batch, warm or faulting as the rank's allocator makes them
        env.update(default_cpu_rank_env(env))
    command = [sys.executable, "-m", "runner.step_time.measured.zero3_overhead", "--device-type", device_type]
    if threads:
        command += ["--threads", str(threads)]
    try:
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):  # a timeout included
        return None
    if done.returncode != ExitCode.OK:
        return None
    for line in reversed(done.stdout.splitlines()):  # DeepSpeed may print above the result
        try:
            result = json.loads(line)
        except ValueError:
            continue
        if isinstance(result, dict) and RESULT_KEY in result:
            return result
    return None


def engine_param_seconds(*, device_type: str, threads: int | None = None) -> dict[str, float] | None:
    """Seconds per parameter tensor per micro-batch that DeepSpeed's engine adds to a bare
    forward and backward, at each ZeRO stage ("0" to "3"; a stage that measured at or below the
    bare loop adds 0), between optimizer steps; :data:`PERSISTENT_KEY`: stage 3 with every tensor
    persistent. ZeRO-3's hooks per tensor visited are that less "0"; its gather per gathered
    tensor, "3" less that (at small tensors). :data:`BYTE_KEY`: what ZeRO-3 adds per byte of a
    tensor beyond that, from the same stack at width :data:`WIDE`. None when DeepSpeed is missing,
    or the child fails or times out."""
    result = _child_result(device_type, threads)
    figures = result.get(ENGINE_KEY) if result is not None else None
    if not isinstance(figures, dict):
        return None
    kept = {
        str(zero_stage): max(0.0, float(value))
        for zero_stage, value in figures.items()
        if isinstance(value, (int, float)) and math.isfinite(value)
    }
    return kept or None


# ---- the child's side: runs under `python -m runner.step_time.measured.zero3_overhead` -------------------


def _quiet_deepspeed() -> None:
    """DeepSpeed's logs and deprecation warnings off, as runner/engine/initialize.py
    ``_quiet_deepspeed`` turns them off: a warning printed at every collective would be timed
    with ZeRO-3's hooks."""
    # Deferred: the child process alone loads DeepSpeed and torch (the planner never does).
    import logging
    import warnings

    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
        category=FutureWarning,
    )


def _skip_inference_shm_op() -> None:
    """Keep DeepSpeed from JIT-building its CPU shared-memory all-reduce (about 45 s on a fresh
    machine), which only inference uses; mirrors runner/engine/distributed.py
    ``skip_inference_shm_op``, which this layer may not import."""
    # Deferred: the child process alone loads DeepSpeed and torch (the planner never does).
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if compatible is not None:
        compatible["deepspeed_shm_comm"] = False


def _import_muon_uncompiled() -> None:
    """Import DeepSpeed's Muon module (DeepSpeed imports it whatever the optimizer) without its
    ``torch.compile`` decorations, which import TorchInductor (about 1.5 s): nothing here runs
    Muon. runner/engine/fixes/muon_compiles_at_import.py defers them for a rank instead."""
    # Deferred: the child process alone loads DeepSpeed and torch (the planner never does).
    import torch

    def uncompiled(model: Any = None, **_: Any) -> Any:
        return model if model is not None else (lambda fn: fn)

    real = torch.compile
    torch.compile = uncompiled  # type: ignore[assignment]
    try:
        __import__("deepspeed.runtime.zero.muon.original_muon")
    except ImportError:  # a DeepSpeed before Muon
        pass
    finally:
        torch.compile = real  # type: ignore[assignment]


def _join_group(device_type: str, threads: int | None) -> Any:
    """One rank's process group (gloo on CPU, nccl on CUDA); this rank's torch.device."""
    # Deferred: the child process alone loads DeepSpeed and torch (the planner never does).
    import deepspeed
    import torch

    if device_type == "cpu":
        _skip_inference_shm_op()
        if threads:
            torch.set_num_threads(threads)
    backend = "nccl" if device_type == "cuda" else "gloo"
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    if device_type != "cuda":
        return torch.device("cpu")
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


def _model(width: int = WIDTH) -> Any:
    """BLOCKS of the runner's TransformerBlock at ``width`` (HEADS heads, SwiGLU at 8/3 the
    width), with their rotary tables: (tokens, width) -> (tokens, width), SEQ tokens a sequence."""
    # Deferred: the child process alone loads DeepSpeed and torch (the planner never does).
    import torch
    from torch import nn

    from runner.config import ModelConfig
    from runner.model.transformer import TransformerBlock, rope_cache

    cfg = ModelConfig(
        n_layer=BLOCKS, n_head=HEADS, d_model=width, ffn_hidden=8 * width // 3 // 4 * 4, max_seq_len=SEQ
    )

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(BLOCKS))
            cos, sin = rope_cache(cfg, SEQ)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x.view(-1, SEQ, width)
            for block in self.blocks:
                x = block(x, self.cos, self.sin)
            return x.view(-1, width)

    torch.manual_seed(0)
    stack = Stack()
    with torch.no_grad():
        for param in stack.parameters():
            if param.dim() > 1:
                param.normal_(0.0, width**-0.5)
    return stack


# Micro-batches per optimizer step in the child's DeepSpeed configs: no timed micro-step reaches
# the boundary, so each is a micro-batch's own work (ZeRO-1 and 2 reduce only there, or per
# bucket), never the step's reduction or the optimizer's.
NO_BOUNDARY = 1_000_000
STAGES = (0, 1, 2, 3)
ZERO3 = 3


def _ds_config(zero_stage: int, params: int, width: int, *, persistent: bool = False) -> JsonObject:
    """fp32, torch's AdamW, and the ZeRO keys runner/engine/deepspeed_config.py sets.

    ``stage3_param_persistence_threshold`` 0 partitions every tensor, as a real model's large
    ones are above the runner's derived threshold (10 h); ``persistent`` keeps every tensor whole
    (:data:`ALL_PERSISTENT`), so that run pays the hooks and no gather. The prefetch bucket is the runner's
    derived 0.9 h^2 at this stack's width; ``stage3_max_live_parameters`` stays DeepSpeed's
    default, as the runner leaves it. The reduce bucket is capped at the model's size as
    ``reduce_bucket_elements`` caps it.
    """
    zero: JsonObject = {
        "stage": zero_stage,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "reduce_bucket_size": params,
        "allgather_bucket_size": 500_000_000,
    }
    if zero_stage == ZERO3:
        zero["stage3_param_persistence_threshold"] = ALL_PERSISTENT if persistent else 0
        # about one matrix ahead, as the runner's derived 0.9 h^2 (runner/engine/deepspeed_config.py
        # ``zero3_fetch``) prefetches a model of width h
        zero["stage3_prefetch_bucket_size"] = int(0.9 * width * width)
    return {
        "train_batch_size": NO_BOUNDARY,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": NO_BOUNDARY,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-3, "torch_adam": True, "adam_w_mode": True},
        },
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


class _Rounds:
    """Micro-steps of bare stacks and DeepSpeed engines, timed in interleaved rounds; the fastest
    round of each counts, as in runner/hardware/calibrate.py: other work on the host only ever slows
    a round down. Wall time: the hooks' waits (the gather's handles, the other threads DeepSpeed and
    torch run) are the step's as much as this thread's own work."""

    def __init__(self, device: Any) -> None:
        import torch  # deferred: the child process alone loads torch

        self.device, self.cuda = device, device.type == "cuda"
        self.bare: dict[str, Any] = {}  # name -> a stack run without DeepSpeed
        self.engines: dict[str, Any] = {}  # name -> a DeepSpeed engine
        self.inputs = {width: torch.randn(ELEMENTS // width, width, device=device) for width in (WIDTH, WIDE)}
        self.best: dict[str, float] = {}
        self.rounds = ROUNDS

    def _micro_step(self, name: str) -> None:
        x = self.inputs[WIDE if name.startswith("wide") else WIDTH]
        if name in self.bare:
            self.bare[name](x).square().mean().backward()  # gradients accumulate, as between boundaries
            return
        engine = self.engines[name]
        engine.backward(engine(x).square().mean())  # no optimizer step: a step's, not a micro-batch's

    def _round_seconds(self, name: str) -> float:
        import torch  # deferred: the child process alone loads torch

        if self.cuda:
            torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        for _ in range(MICRO_STEPS):
            self._micro_step(name)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - started) / MICRO_STEPS

    def time(self, names: list[str]) -> None:
        """Time ``names`` together, interleaved (a burst of other work hits all alike)."""
        best = dict.fromkeys(names, math.inf)
        timing = time.perf_counter()
        for index in range(WARMUP_ROUNDS + ROUNDS):
            for name in names:
                seconds = self._round_seconds(name)
                if index >= WARMUP_ROUNDS:
                    best[name] = min(best[name], seconds)
            if index >= WARMUP_ROUNDS + MIN_ROUNDS - 1 and time.perf_counter() - timing > TIMING_BUDGET_S:
                break  # a busy host: its quietest rounds so far
        self.best.update(best)
        self.rounds = min(self.rounds, index + 1 - WARMUP_ROUNDS)


def _engines(rounds: _Rounds, stacks: list[tuple[str, int, int]]) -> list[str]:
    """A DeepSpeed engine for each (name, ZeRO stage, width) of ``stacks``, in ``rounds``."""
    import deepspeed  # deferred: only the child process imports DeepSpeed

    for name, zero_stage, width in stacks:
        model = _model(width)
        params = sum(p.numel() for p in model.parameters())
        config = _ds_config(zero_stage, params, width, persistent=name == PERSISTENT_KEY)
        rounds.engines[name], *_ = deepspeed.initialize(model=model, config=config)
    return [name for name, _, _ in stacks]


def _measure(device_type: str, threads: int | None) -> dict[str, Any]:
    """The child's measurement: each ZeRO stage's micro-step minus a bare loop's (the same stack's
    forward and backward, no engine), over the number of parameter tensors; ZeRO-3's figure
    (stage 3 minus stage 0); and the micro-steps they are made of.

    Stages 0 to 2 and the bare stacks are built and timed before any stage-3 engine exists, so
    that what ZeRO-3 does to the process is stage 3's alone: on one 2-core host, the first ZeRO-3
    ``deepspeed.initialize`` slowed every later computation in the process (2 threads: the
    runner's tiny model run bare, 98 -> 144-158 ms a forward and backward; context switches
    116 -> about 4,300 a second; OpenMP's workers sleeping between parallel regions instead of
    spinning), where a ZeRO-1 engine did not. Timed after it, stage 0 carried the same slowdown
    as stage 3 and their difference hid it. On another (AMD EPYC) the same check put stage 3
    and stage 1 within its noise (docs/benchmarks-time-model.md, 2026-12-06 evening).
    """
    # Deferred: only the child process imports DeepSpeed and torch; the planner's never does.
    import torch

    # Flush denormals to zero, first, so that every thread torch starts inherits it: DeepSpeed
    # divides the loss by NO_BOUNDARY's million micro-batches, so the stack's gradients fall below
    # fp32's normal range, where an x86 core computes tens of times slower (a real model's
    # gradients stay normal; here the denormals once took stage 0 at width 512 from 32 to 150 ms).
    torch.set_flush_denormal(True)
    _quiet_deepspeed()
    _import_muon_uncompiled()
    device = _join_group(device_type, threads)
    rounds = _Rounds(device)
    rounds.bare["bare"] = _model(WIDTH).to(device)
    below = _engines(rounds, [*((str(s), s, WIDTH) for s in STAGES if s != ZERO3), ("wide0", 0, WIDE)])
    rounds.time(["bare", *below])
    zero3 = _engines(
        rounds, [(str(ZERO3), ZERO3, WIDTH), (PERSISTENT_KEY, ZERO3, WIDTH), ("wide3", ZERO3, WIDE)]
    )
    rounds.time(zero3)
    best = rounds.best
    # stage 0 keeps every tensor whole: its module counts the wide stack's parameters
    params = {
        width: sum(p.numel() for p in module.parameters())
        for width, module in ((WIDTH, rounds.bare["bare"]), (WIDE, rounds.engines["wide0"].module))
    }
    tensors = sum(1 for _ in rounds.bare["bare"].parameters())
    torch.distributed.destroy_process_group()  # without it gloo may abort at exit
    small, wide = (best["3"] - best["0"]) / tensors, (best["wide3"] - best["wide0"]) / tensors
    # A difference inside the rounds' noise (stage 0 against the bare loop) costs nothing.
    engine = {
        name: max(0.0, (best[name] - best["bare"]) / tensors) for name in (*map(str, STAGES), PERSISTENT_KEY)
    }
    byte_step = 4 * (params[WIDE] - params[WIDTH]) / tensors  # fp32 bytes a tensor, wide less small
    engine[BYTE_KEY] = max(0.0, (wide - small) / byte_step)
    return {
        RESULT_KEY: small,
        ENGINE_KEY: engine,
        "micro_s": best,
        "tensors": tensors,
        "rounds": rounds.rounds,
    }


def main(argv: list[str] | None = None) -> None:
    """Measure in this process and print ``{"zero3_param_s": seconds, ...}`` as the last line."""
    parser = argparse.ArgumentParser(description="ZeRO-3's host overhead per parameter tensor")
    parser.add_argument("--device-type", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    print(json.dumps(_measure(args.device_type, args.threads)), flush=True)


__all__ = ["BYTE_KEY", "PERSISTENT_KEY", "engine_param_seconds"]


if __name__ == "__main__":
    main()
