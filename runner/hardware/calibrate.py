"""Short micro-benchmarks of this device, for the step-time model (runner/step_time/estimate.py).

Each measures one kind of work a training step does, on the device and with the threads a
rank will have, and returns seconds or a rate:

- :func:`gemm_rates`: a matmul's forward (X W), input gradient (dY W^T) and weight gradient
  (X^T dY), FLOP/s at the given (M, K, N). A shape whose forward exceeds ``max_flops`` is
  measured with the larger of M and N halved until it fits: a GEMM's rate stops growing with
  its size long before, and K (the reduction) and the smaller side keep their intensity. The
  capped calls cycle through distinct operands, so each streams from memory as the full one's
  would; each rate is of the median call.
- :func:`attention_seconds`: ``F.scaled_dot_product_attention`` (causal) forward and backward,
  the kernel runner/model/transformer.py calls.
- :func:`copy_rate`: bytes read plus written per second by a copy of ``num_bytes``, a
  stand-in for every memory-bound (elementwise) kernel of that size.
- :func:`fresh_rate`: a CPU's bytes per second into freshly allocated large tensors (page faults).
- :func:`op_seconds`: one eager op's dispatch, forward and autograd backward, on a
  one-element tensor: what a step pays per kernel whatever its size.
- :func:`adamw_rate`: torch's fused AdamW (runner/engine/deepspeed_config.py asks for it) on
  a flat fp32 tensor, in bytes per second at 28 B a parameter (p, g, m, v read; p, m, v written).
- :func:`allreduce_costs`: two processes' all-reduce over the backend the runner uses
  (gloo on CPU), at a small and a large size: latency and bytes per second;
  :func:`allgather_costs` the same of an all-gather.

Every timing is the fastest of a few calls after warm-up calls, a GEMM's the median.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from runner.hardware.host_allocator import default_cpu_rank_env

# The all-gather is timed at this buffer, past a CPU's caches: gloo's all-gather slows from
# about 2 GB/s received at 16 MiB to 0.65 GB/s at 64-256 MiB on a 2-core CPU (its all-reduce
# keeps 2 GB/s), and ZeRO-1/2 gather the parameters in buckets of up to 5e8 elements.
GATHER_BYTES = 64 * 2**20
MAX_GEMM_FLOPS = 2e9  # a forward above this is measured at a smaller M (see the module docstring)
CAPPED_COPIES = 8  # distinct operands a capped GEMM cycles through (``gemm_rates``)
MIN_TIMED_S = 0.05  # ``timed``: a short call is repeated until its timings add up to this
MAX_REPEATS = 25  # ... or to this many calls


_neighbours = 0  # threads that run the measured work beside it: the host's other ranks (``threads``)


@contextlib.contextmanager
def threads(count: int | None, *, neighbours: int = 0) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` (a rank's: runner/engine/distributed.py) meanwhile,
    and the heavy measurements taken with ``neighbours`` copies of the same work running beside
    them, as the host's other ranks will: they share its caches, memory bandwidth and clocks."""
    global _neighbours
    before, kept = torch.get_num_threads(), _neighbours
    if count:
        torch.set_num_threads(count)
    _neighbours = neighbours
    try:
        yield
    finally:
        torch.set_num_threads(before)
        _neighbours = kept


@contextlib.contextmanager
def _beside(fn: Callable[[], Any], count: int) -> Iterator[None]:
    """``count`` threads run ``fn`` in a loop meanwhile (torch's ops release the GIL)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            fn()

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(  # noqa: PLR0913
    fn: Callable[[], Any],
    device: torch.device,
    *,
    repeats: int = 5,
    warmup: int = 2,
    shared: bool = True,
    beside: Callable[[], Callable[[], Any]] | None = None,
    median: bool = False,
    extend: bool = True,
) -> float:
    """The fastest of at least ``repeats`` calls of ``fn()`` (more for a short call:
    :data:`MIN_TIMED_S`), in seconds, after ``warmup`` calls: other work on the device only ever
    slows a call down. ``shared``: on a CPU, with the neighbours of :func:`threads` running ``fn``
    too (a measurement dominated by Python would contend for the GIL instead, so op dispatch is
    timed alone). ``beside`` makes each neighbour its own copy of the work where ``fn`` keeps state
    (autograd's gradients) that two threads must not share. ``median``: the median call instead, a
    kernel's typical time where a step runs it once among others (a GEMM's fastest call runs 10-15%
    above its median on a 2-core VM). ``extend=False``: exactly ``repeats`` calls, as a
    collective's ranks must each make the same calls."""
    times: list[float] = []
    at_least = MIN_TIMED_S if extend else 0.0
    count = _neighbours if (shared and device.type == "cpu") else 0
    with _beside(fn if beside is None else beside(), count) if count else contextlib.nullcontext():
        for _ in range(warmup):
            fn()
        # A call of a millisecond or less is timed further, up to MAX_REPEATS calls or
        # MIN_TIMED_S in all: five such calls' median moved by 20% between two calibrations.
        while len(times) < repeats or (sum(times) < at_least and len(times) < MAX_REPEATS):
            _sync(device)
            started = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - started)
    return statistics.median(times) if median else min(times)


def gemm_rates(
    m: int, k: int, n: int, *, dtype: torch.dtype, device: torch.device, max_flops: float = MAX_GEMM_FLOPS
) -> tuple[float, float, float]:
    """FLOP/s of a linear layer's three GEMMs at (m, k, n), as nn.Linear lays them out (weight
    (n, k)): forward X W^T, input gradient dY W, weight gradient dY^T X."""
    full_m, full_n = m, n
    while 2.0 * m * k * n > max_flops and max(m, n) > 64:
        if m >= n:
            m //= 2
        else:
            n //= 2
    # A capped shape cycles through as many distinct operands as the full one holds (up to
    # CAPPED_COPIES): each call reads a weight (or input) no call before it read, from memory, as
    # the full GEMM streams its operand once; one capped copy would sit in the caches instead (the
    # gpt2 head, 50257 x 768 at 256 tokens: 319 GFLOP/s cached against 254 at the full shape, 301
    # cycled, on a 2-core Xeon VM).
    copies = min(CAPPED_COPIES, (full_m // m) * (full_n // n))
    xs = [torch.randn(m, k, dtype=dtype, device=device) for _ in range(copies if m < full_m else 1)]
    weights = [torch.randn(n, k, dtype=dtype, device=device) for _ in range(copies if n < full_n else 1)]
    dys = [torch.randn(m, n, dtype=dtype, device=device) for _ in range(copies)]
    calls = itertools.count()

    def operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        i = next(calls)
        return xs[i % len(xs)], weights[i % len(weights)], dys[i % len(dys)]

    def forward_call() -> Any:
        x, weight, _ = operands()
        return F.linear(x, weight)

    def grad_input_call() -> Any:
        _, weight, dy = operands()
        return dy @ weight

    def grad_weight_call() -> Any:
        x, _, dy = operands()
        return dy.T @ x

    flops = 2.0 * m * k * n
    forward = timed(forward_call, device, median=True)
    grad_input = timed(grad_input_call, device, median=True)
    grad_weight = timed(grad_weight_call, device, median=True)
    return flops / forward, flops / grad_input, flops / grad_weight


def attention_seconds(
    batch: int, heads: int, seq: int, head_dim: int, *, dtype: torch.dtype, device: torch.device
) -> tuple[float, float]:
    """Seconds of causal SDPA's forward, and of its backward, at (batch, heads, seq, head_dim)."""
    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, dtype=dtype, device=device)

    def forward() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both() -> None:
        forward().backward(grad)

    forward_s = timed(lambda: forward().detach(), device)
    return forward_s, max(0.0, timed(both, device) - forward_s)


def copy_rate(num_bytes: int, *, device: torch.device) -> float:
    """Bytes read plus written per second by a contiguous copy of ``num_bytes`` bytes."""
    src = torch.empty(max(1, num_bytes), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2.0 * src.numel() / timed(lambda: dst.copy_(src), device, repeats=9)


def fresh_rate(num_bytes: int = 64 * 2**20, *, device: torch.device) -> float | None:
    """Bytes per second zeroed in a freshly allocated ``num_bytes`` tensor on a CPU (None on CUDA,
    whose caching allocator hands memory back warm). glibc serves allocations above its mmap
    threshold (at most 32 MiB) from fresh pages and returns them at free: each use pays the
    kernel's page faults, several times slower than writing warm memory."""
    if device.type != "cpu":
        return None
    numel = max(1, num_bytes // 4)
    return 4.0 * numel / timed(lambda: torch.zeros(numel), device, repeats=5)


def op_seconds(*, device: torch.device) -> float:
    """Seconds per eager op, forward and its backward, on a one-element tensor (dispatch, autograd)."""
    chain = 50
    x = torch.ones(1, device=device, requires_grad=True)

    def run() -> None:
        y = x
        for _ in range(chain):
            y = y * 1.0001
        y.backward()

    return timed(run, device, repeats=9, shared=False) / chain


def adamw_rate(numel: int, *, device: torch.device) -> float:
    """Bytes per second torch's fused AdamW moves on a flat fp32 tensor (28 B a parameter)."""
    param = torch.zeros(max(1, numel), dtype=torch.float32, device=device, requires_grad=True)
    param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW([param], lr=1e-4, fused=True)
    optimizer.step()  # its states exist before any neighbour (``threads``) steps the same ones
    return 28.0 * param.numel() / timed(optimizer.step, device)


def _allreduce_worker(rank: int, init_file: str, sizes: list[int], out: Any, gather: bool = False) -> None:
    """One of two processes: time all-reduces (``gather``: all-gathers, each rank giving half) of
    ``sizes`` bytes (fp32) and put rank 0's on ``out``."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    device = torch.device("cpu")
    seconds = []
    for size in sizes:
        buffer = torch.ones(max(1, size // 4))
        # a small collective's fastest of many: a few calls may all find the other process
        # unscheduled (0.25 ms fastest of 25 against 1.7 ms fastest of 7, on a 2-core CPU)
        repeats = 25 if size < 2**20 else 7
        if gather:
            part = torch.ones(max(1, size // 8))
            gathered = functools.partial(
                torch.distributed.all_gather_into_tensor, buffer[: 2 * part.numel()], part
            )
            seconds.append(timed(gathered, device, repeats=repeats, extend=False))
            continue
        reduced = functools.partial(torch.distributed.all_reduce, buffer)
        seconds.append(timed(reduced, device, repeats=repeats, extend=False))
    torch.distributed.destroy_process_group()
    if rank == 0:
        out.put(seconds)


def allreduce_costs(small: int = 4096, large: int = 16 * 2**20) -> tuple[float, float]:
    """(latency s, bytes/s) of a two-process gloo all-reduce on this host: a line through two sizes.

    ``bytes/s`` is of the ring all-reduce's bytes sent per rank, 2 (n - 1) / n x the buffer
    (runner.comm.allreduce_bytes): one buffer's worth for two ranks.
    """
    return _collective_costs(small, large, gather=False)


def allgather_costs(small: int = 4096, large: int = GATHER_BYTES) -> tuple[float, float]:
    """(latency s, bytes/s) of a two-process gloo all-gather into a buffer of each size (each
    rank gives half); ``bytes/s`` of the (n - 1) / n x the buffer a rank receives
    (runner.comm.allgather_bytes)."""
    return _collective_costs(small, large, gather=True)


@contextlib.contextmanager
def _rank_allocator_env() -> Iterator[None]:
    """This process's environment meanwhile as a CPU rank's, with the allocator the local launcher
    gives it by default (runner/hardware/host_allocator.py): a spawned worker inherits it, and
    times gloo's buffers warm or faulting as a rank would."""
    extra = default_cpu_rank_env(os.environ)
    before = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _collective_costs(small: int, large: int, *, gather: bool) -> tuple[float, float]:
    """A line through two sizes' timings of the collective (see :func:`allreduce_costs`)."""
    import torch.multiprocessing as mp  # deferred: only a calibration of a collective spawns

    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, f"init-{socket.gethostname()}")
        workers = [
            context.Process(target=_allreduce_worker, args=(rank, init_file, [small, large], queue, gather))
            for rank in range(2)
        ]
        with _rank_allocator_env():
            for worker in workers:
                worker.start()
        small_s, large_s = queue.get(timeout=120)
        for worker in workers:
            worker.join(timeout=60)
    moved = 0.5 if gather else 1.0  # bytes a rank moves per buffer byte, two ranks
    per_byte = max(1e-12, (large_s - small_s) / (moved * (large - small)))
    return max(0.0, small_s - moved * small * per_byte), 1.0 / per_byte


__all__ = [
    "GATHER_BYTES",
    "MAX_GEMM_FLOPS",
    "adamw_rate",
    "allgather_costs",
    "allreduce_costs",
    "attention_seconds",
    "copy_rate",
    "fresh_rate",
    "gemm_rates",
    "op_seconds",
    "threads",
    "timed",
]
