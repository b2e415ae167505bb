"""What the planner assumes of one device: its memory, its peak, its links, and where each figure came from.

A named cluster (``conf/cluster/<name>.yaml``) gives datasheet figures. Any figure the
cluster leaves unset (``null``, as ``cluster=local`` does) is detected on this host:

- device memory: CUDA's total memory of device 0 ("detected"); on a CPU host, the host
  RAM (the smaller of physical RAM and the cgroup limit, runner/hardware/cgroup_memory.py) split
  evenly over the ranks that would run on this host ("detected").
- peak FLOP/s: resolved as a run's MFU resolves it (runner.hardware.mfu_peak.resolve_peak): on
  CUDA the dense datasheet figure for the detected device name ("datasheet"); on CPU the
  matmul calibration kept for this machine ("measured"), read once per process and precision.
- GPUs per node: CUDA's device count, or one rank per CPU core (runner/hardware/host_ranks.py, as the
  local launcher places them).
- host RAM per node: this host's RAM, the smaller of physical RAM and the cgroup limit
  ("detected"); a named cluster gives its system datasheet's figure.
- link bandwidths: never detected. Unset means unknown, and no communication time is
  predicted for a layout that needs that link.

Units: bytes and bytes/s inside; the config's GB and GB/s are decimal (1e9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.comm import StepLatency
from runner.config import ClusterConfig, ModelConfig, Precision
from runner.hardware import calibration_seconds
from runner.hardware.cgroup_memory import cgroup_memory_limit
from runner.hardware.cpu_busy import OthersUse
from runner.hardware.cuda_devices import cuda_available
from runner.hardware.host_pace import reference_seconds
from runner.hardware.host_ranks import host_ranks
from runner.step_time.measured import figures as calibrations

if TYPE_CHECKING:
    import torch

GB = 1e9  # decimal gigabyte: the unit of cluster.device_memory_gb and *_gbps
# A calibration figure measured while other processes kept more than this many of the rank's
# cores busy reads low: it is cached marked provisional, and measured again by a later plan that
# finds the host quiet (runner/step_time/measured/figures.py).
BUSY_CORES = 0.25
BUSY_WINDOW_S = 0.2  # the shortest measurement whose busy cores are read
QUIET_SAMPLE_S = 0.25  # how long a plan watches the host before measuring a provisional figure again
PROGRESS_AFTER_S = 2.0  # a measurement still running after this long says on stderr what it measures
# A CPU times a block whole (runner/step_time/measured/block_timing.py) only up to this many
# parameters: llama_1b's block (about 6e7) is timed; llama_7b's (2e8) and llama_70b's (8.6e8:
# 3.4 GB in fp32, twice over with the neighbour rank's copy) are not, and their parts go unscaled
# (the gemm term says so).
BLOCK_CAP_PARAMS = 1e8
# A CPU measures a block's non-GEMM part and the loss with at most this many elements in the
# largest tensor (64 MiB in fp32), halving micro then seq to fit; the part above the ops' dispatch
# floor is scaled by the tokens (runner/step_time/measured/figures.py ``rest_seconds``), and the term says so.
REST_CAP_ELEMENTS = 2**24


@dataclass(frozen=True)
class Figure:
    """One number the plan rests on (None: unknown) and where it came from."""

    value: float | None
    source: str


@dataclass(frozen=True)
class Device:
    """The device a plan is sized for: memory, GPUs per node, and (optionally) peak and links."""

    name: str
    memory_bytes: Figure
    gpus_per_node: Figure
    host_memory_bytes: Figure  # host RAM of one node, shared by its ranks (runner/plan/host.py)
    peak_flops: Figure
    intra_node_bytes_per_s: Figure
    # A ring collective's bus bandwidth across nodes (:func:`rails_bandwidth`), and one device's
    # share of its node's ports for the pipeline's point-to-point sends.
    inter_node_bytes_per_s: Figure
    inter_node_p2p_bytes_per_s: Figure = field(default_factory=lambda: Figure(None, "not resolved"))
    # NCCL's per-collective and per-step latencies (runner.comm.StepLatency); None: unknown, and
    # collectives on the cluster's links are priced by bandwidth alone.
    step_latency: StepLatency | None = None
    is_host: bool = False  # CPU ranks: offloaded ("host") bytes share the same memory
    # The step-time model's figures (runner/step_time/measured/figures.py); None: the roofline only.
    calibration: calibrations.Calibration | None = field(default=None, compare=False)

    @property
    def per_node(self) -> int:
        """GPUs (ranks) per node as an int."""
        return int(self.gpus_per_node.value or 1)


def host_ram_bytes() -> tuple[int, str]:
    """This host's RAM in bytes (the cgroup limit when lower) and how it was found."""
    import psutil  # deferred: only a plan that detects the host's RAM reads it

    physical = int(psutil.virtual_memory().total)
    limit = cgroup_memory_limit()
    if limit is not None and limit < physical:
        return limit, "cgroup memory limit"
    return physical, "physical RAM"


@functools.cache
def measured_cpu_peak(precision: str) -> float:
    """Matmul FLOP/s of this CPU at `precision`, measured once per process (about half a second)."""
    # deferred: runner.hardware.mfu_peak imports torch; only a plan on CPU ranks measures the CPU
    from runner.hardware.mfu_peak import best_cpu_peak

    return best_cpu_peak(Precision(precision)).flops


def _gpus_per_node(cluster: ClusterConfig) -> Figure:
    if cluster.gpus_per_node is not None:
        return Figure(cluster.gpus_per_node, f"cluster {cluster.name}")
    count, cuda = host_ranks()
    return Figure(count, "detected: CUDA device count" if cuda else "detected: one rank per CPU core")


def _memory(cluster: ClusterConfig, *, cuda: bool, ranks_here: int) -> Figure:
    if cluster.device_memory_gb is not None:
        return Figure(cluster.device_memory_gb * GB, _cluster_source(cluster, "device_memory_gb"))
    if cuda:
        import torch  # deferred: only where CUDA is there; a plan elsewhere does without torch

        # cudaGetDeviceProperties: reads the device's attributes; allocates nothing on it.
        props = torch.cuda.get_device_properties(0)
        return Figure(float(props.total_memory), f"detected: CUDA total memory of {props.name}")
    ram, how = host_ram_bytes()
    return Figure(
        ram / ranks_here,
        f"detected: host {how} {ram / GB:.1f} GB / {ranks_here} rank(s) on this host",
    )


def _host_memory(cluster: ClusterConfig) -> Figure:
    if cluster.host_memory_gb is not None:
        return Figure(cluster.host_memory_gb * GB, _cluster_source(cluster, "host_memory_gb"))
    ram, how = host_ram_bytes()
    return Figure(float(ram), f"detected: this host's {how}")


def _peak(cluster: ClusterConfig, precision: Precision, *, cuda: bool) -> Figure:
    """The peak as a run's MFU resolves it (runner.hardware.mfu_peak.resolve_peak), worded for the plan;
    an unknown CUDA device is unknown here (the plan still sizes memory), and a CPU's measurement is
    kept for the process (:func:`measured_cpu_peak`)."""
    # deferred: runner.hardware.mfu_peak imports torch; only a plan that predicts time resolves a peak
    from runner.hardware.mfu_peak import Peak, cluster_peak_key, resolve_peak
    from runner.hardware.peak_flops import UnknownDeviceError

    threads = os.cpu_count() or 1

    def cpu_peak(wanted: Precision) -> Peak:
        words = f"measured: {wanted.value} matmul on this CPU ({threads} core(s))"
        return Peak(measured_cpu_peak(wanted.value), words, calibrated=True, origin="measured")

    accelerator = "cuda" if cuda else "cpu"
    try:
        peak = resolve_peak(cluster, precision, accelerator=accelerator, cpu_peak=cpu_peak)
    except UnknownDeviceError as error:
        return Figure(None, f"unknown for {error.device_name}: set cluster.peak_tflops")
    if peak.origin == "config":
        return Figure(peak.flops, f"config: {peak.source}")
    if peak.origin == "cluster":
        return Figure(peak.flops, _cluster_source(cluster, cluster_peak_key(precision)))
    return Figure(peak.flops, peak.source)


_CLUSTER_GROUP = Path(__file__).resolve().parents[2] / "conf" / "cluster"


@functools.cache
def _cluster_file_value(name: str, key: str) -> float | None:
    """``key`` as the shipped datasheet ``conf/cluster/<name>.yaml`` writes it; None when the file
    or the key is not there. Read as plain YAML data (the run's config itself arrives typed):
    it tells a datasheet figure from one the user set over it."""
    import yaml  # deferred: only a plan for a named cluster reads its datasheet

    path = _CLUSTER_GROUP / f"{name}.yaml"
    if not path.is_file():
        return None
    listed = yaml.safe_load(path.read_text())
    value = listed.get(key) if isinstance(listed, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _cluster_source(cluster: ClusterConfig, key: str) -> str:
    """A named cluster's own figure is its datasheet's; one set elsewhere (an override) is config."""
    if cluster.name == "local":
        return f"config: cluster.{key}"
    listed = _cluster_file_value(cluster.name, key)
    if listed is not None and listed != getattr(cluster, key):
        return f"config: cluster.{key}, over cluster {cluster.name}'s datasheet {listed:g}"
    return f"datasheet: cluster {cluster.name}"


def _link(cluster: ClusterConfig, key: str) -> Figure:
    gbps = getattr(cluster, key)
    if gbps is None:
        return Figure(None, f"unknown: cluster.{key} not set")
    return Figure(gbps * GB, _cluster_source(cluster, key))


def step_latency(cluster: ClusterConfig) -> StepLatency | None:
    """The cluster's NCCL latencies (conf/cluster: collective_base_us, intra/inter_node_step_us), or None."""
    figures = (cluster.collective_base_us, cluster.intra_node_step_us, cluster.inter_node_step_us)
    if any(f is None for f in figures):
        return None
    base, intra, inter = (float(f) * 1e-6 for f in figures if f is not None)
    return StepLatency(base_s=base, intra_node_s=intra, inter_node_s=inter)


def rails_bandwidth(cluster: ClusterConfig) -> tuple[Figure, Figure]:
    """(ring collectives' bus bandwidth across nodes, one device's point-to-point bandwidth across nodes).

    NCCL runs several rings at once (its channels), each leaving a node through its own network
    port, one rail each, and splits the data over them. A ring over n devices sends 2(n-1)/n of
    the data per device (nccl-tests' bus bandwidth, doc/PERFORMANCE.md), and of each ring's hops
    only one per node crosses the network: with R ports of B each, the network carries the
    node's share in 1/R of the time one port would, while every device still sends its whole
    share over NVLink. A ring across nodes runs at min(intra-node, R x B); one port per device,
    as DGX A100, H100 and H200 have (8 x 200 or 400 Gb/s), makes it the NVLink or 8 ports.
    A pipeline's send goes from one device to its peer in the next node over its rail:
    R x B / gpus per node.
    """
    port = _link(cluster, "inter_node_gbps")
    if port.value is None:
        return port, port
    per_node = cluster.gpus_per_node or 1
    nics = cluster.nics_per_node or per_node
    ports = "cluster.nics_per_node" if cluster.nics_per_node is not None else "one per device"
    network = nics * port.value
    intra = _link(cluster, "intra_node_gbps").value
    ring = network if intra is None else min(network, intra)
    bound = "the network" if ring == network else "NVLink (cluster.intra_node_gbps)"
    each = f"{port.value / GB:g} GB/s"
    ring_words = f"NCCL's rings over {nics} rails ({ports}) x {each}, bound by {bound}; {port.source}"
    p2p = network / per_node
    return Figure(ring, ring_words), Figure(
        p2p, f"{nics} ports x {port.value / GB:g} GB/s / {per_node} devices; {port.source}"
    )


def _quietest(figure: Callable[[], Any], *, timed_busy: bool) -> tuple[Any, bool]:
    """``figure()`` once, and whether the host was quiet meanwhile (``timed_busy=False``: a GPU,
    whose measurement other CPU work does not slow). A busy figure is not tried again now: it is
    cached provisional and measured again by a later plan on a quiet host."""
    others, started = OthersUse.start(), time.perf_counter()
    value = figure()
    # /proc/stat counts in ticks (10 ms): a shorter measurement cannot tell, and the
    # fastest of its repeats already leaves a burst of other work out.
    short = time.perf_counter() - started < BUSY_WINDOW_S
    busy = 0.0 if (not timed_busy or short) else (others.cores() or 0.0)
    return value, busy <= BUSY_CORES


def _measure_here(
    precision: Precision, *, cuda: bool, threads: int, ranks_here: int
) -> calibrations.Calibration:
    """This host's device, measured on demand (runner/hardware/calibrate.py) and cached."""
    import platform

    import torch  # deferred: only a plan that predicts time on this host's device measures it

    from runner.hardware import calibrate

    device = torch.device("cuda" if cuda else "cpu")
    dtype = precision.torch_dtype
    cores = f"cpu {platform.machine()}, {os.cpu_count()} cores, {ranks_here} rank(s)"
    name = torch.cuda.get_device_name(0) if cuda else cores
    count = 0 if cuda else threads

    figure = functools.partial(_figure, device=device, dtype=dtype, threads=count, ranks_here=ranks_here)

    def measure(kind: str, shape: tuple[int, ...]) -> tuple[Any, bool]:
        """The figure, and whether the host was quiet while it was measured."""
        with _progress(kind, shape, str(dtype).removeprefix("torch.")):
            return _quietest(functools.partial(figure, kind, shape), timed_busy=not cuda)

    here = calibrations.local(
        name,
        str(dtype).removeprefix("torch."),
        count,
        torch.__version__,
        calibration_seconds.timed(measure),  # the run's wall time names these seconds
        quiet=_quiet_now,
        # a GPU's kernels do not share the host's cores: only a CPU's figures are paced
        pace_now=None if cuda else calibration_seconds.timed(functools.partial(_reference_on, count)),
    )
    if not cuda:  # a GPU times the real shapes
        here.gemm_cap_flops, here.block_cap_params = calibrate.MAX_GEMM_FLOPS, BLOCK_CAP_PARAMS
        here.rest_cap_elements = REST_CAP_ELEMENTS
    return here


def _figure(
    kind: str,
    shape: tuple[int, ...],
    *,
    device: torch.device,
    dtype: torch.dtype,
    threads: int,
    ranks_here: int,
) -> Any:
    """One calibration figure of ``kind`` at ``shape`` on ``device`` in ``dtype``, measured on a
    rank's ``threads`` (0: a GPU's, which do not share the host's cores) beside ``ranks_here`` - 1
    neighbours."""
    # Deferred, as torch is: only a plan that predicts time on this host's device measures it.
    from runner.hardware import calibrate
    from runner.step_time.measured import zero3_overhead as calibrate_zero3
    from runner.step_time.measured.block_timing import block_seconds, cross_entropy_seconds, rest_seconds

    cuda = device.type == "cuda"
    with calibrate.threads(threads or None, neighbours=0 if cuda else ranks_here - 1):
        if kind == "gemm":
            m, k, n = shape
            limit = float("inf") if cuda else calibrate.MAX_GEMM_FLOPS  # a GPU times the real shape
            return list(calibrate.gemm_rates(m, k, n, dtype=dtype, device=device, max_flops=limit))
        if kind == "attention":
            b, h, s, d = shape
            return list(calibrate.attention_seconds(b, h, s, d, dtype=dtype, device=device))
        if kind == "copy":
            return calibrate.copy_rate(shape[0], device=device)
        if kind == "block":
            micro, seq, d, heads, kv, ffn = shape
            cfg = ModelConfig(name="block", n_layer=1, n_head=heads, n_kv_head=kv, d_model=d, ffn_hidden=ffn)
            cfg = dataclasses.replace(cfg, max_seq_len=seq)
            return block_seconds(cfg, micro, seq, dtype=dtype, device=device)
        if kind in ("rest", "rest_compiled"):
            micro, seq, d, heads, kv, ffn = shape
            cfg = ModelConfig(name="block", n_layer=1, n_head=heads, n_kv_head=kv, d_model=d, ffn_hidden=ffn)
            cfg = dataclasses.replace(cfg, max_seq_len=seq)
            compiled = kind == "rest_compiled"
            return rest_seconds(cfg, micro, seq, dtype=dtype, device=device, compiled=compiled)
        if kind == "cross_entropy":
            return cross_entropy_seconds(shape[0], shape[1], dtype=dtype, device=device)
        if kind == "adamw":
            return calibrate.adamw_rate(shape[0], device=device)
        single = {
            "op_s": lambda: calibrate.op_seconds(device=device),
            "fresh_bytes_per_s": lambda: calibrate.fresh_rate(device=device),
            # two ranks of this host over gloo; a GPU's links are the cluster's
            "allreduce": lambda: None if cuda else list(calibrate.allreduce_costs()),
            # past the caches, as a ZeRO-1/2 parameter bucket is (gloo gathers slower there)
            "allgather": lambda: None if cuda else list(calibrate.allgather_costs()),
            # DeepSpeed itself, in a child process of one rank with this rank's threads
            "engine_param_s": lambda: calibrate_zero3.engine_param_seconds(
                device_type=device.type, threads=threads or None
            ),
        }
        if kind in single:
            return single[kind]()
    raise ValueError(f"no calibration of {kind}")


def _reference_on(threads: int) -> float:
    """The host's reference (runner/hardware/host_pace.py) on a rank's threads."""
    from runner.hardware import calibrate  # deferred: it imports torch; only a CPU's calibration paces

    with calibrate.threads(threads or None):
        return reference_seconds()


# What each kind of calibration figure times, for the progress line.
_WHAT = {
    "gemm": "GEMM (M x K x N) {shape} {dtype}, forward and both backward",
    "attention": "causal attention (batch, heads, seq, head dim) {shape} {dtype}",
    "copy": "copy bandwidth over {shape} bytes",
    "block": "one transformer block (micro, seq, d_model, heads, kv heads, ffn) {shape} {dtype}, whole",
    "rest": "one block's non-GEMM part (micro, seq, d_model, heads, kv heads, ffn) {shape} {dtype}, eager",
    "rest_compiled": "one block's non-GEMM part (micro, seq, d_model, heads, kv heads, ffn) {shape} {dtype}, "
    "torch.compile (compiling takes a minute on a CPU)",
    "cross_entropy": "the cross-entropy over (tokens, vocab) {shape} {dtype}",
    "adamw": "fused AdamW over {shape} parameters",
    "op_s": "one eager op's dispatch",
    "fresh_bytes_per_s": "page faults of fresh tensors",
    "allreduce": "a two-process gloo all-reduce",
    "allgather": "a two-process gloo all-gather",
    "engine_param_s": "DeepSpeed's engine per parameter tensor, ZeRO stages 0-3 (a child process)",
}


@contextlib.contextmanager
def _progress(kind: str, shape: tuple[int, ...], dtype: str) -> Iterator[None]:
    """One line on stderr if the measurement is still running after PROGRESS_AFTER_S: what it times."""
    what = _WHAT.get(kind, kind).format(shape="x".join(str(n) for n in shape), dtype=dtype)
    timer = threading.Timer(
        PROGRESS_AFTER_S,
        lambda: print(f"ladder: calibrating this host: {what} ...", file=sys.stderr, flush=True),
    )
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@functools.cache
def _quiet_now() -> bool:
    """Whether other processes kept at most BUSY_CORES of this process's CPUs busy over a short look
    (once per process): a provisional figure is measured again only then."""
    others = OthersUse.start()
    time.sleep(QUIET_SAMPLE_S)
    cores = others.cores()
    return cores is not None and cores <= BUSY_CORES


def _recorded(
    cluster: ClusterConfig, lender: str, precision: Precision, peak: Figure
) -> calibrations.Calibration | None:
    """A calibration file (the cluster's own, or the one it borrows) for ``precision`` on ``peak``.

    A file's compute rates were recorded in its dtype (bfloat16 for every file shipped) on its
    device. They serve another device or precision scaled by the ratio of this plan's peak to the
    recorded device's datasheet peak in the recorded dtype (conf/cluster/<lender>.yaml), so the
    prediction and its bound rest on the same peak: an fp32 plan on an H200 (67 TFLOP/s dense
    fp32, no tensor cores: ladder does not enable TF32) runs its GEMMs at 67/989 of the bf16 rates.
    Without both peaks the compute rates cannot be carried over: no calibration, the bound only.
    """
    record_dtype = calibrations.recorded_dtype(lender)
    key = "peak_tflops_fp32" if record_dtype == "float32" else "peak_tflops_bf16"
    lender_peak = _cluster_file_value(lender, key)
    if peak.value is None or not lender_peak:
        return None
    scale = peak.value / (lender_peak * 1e12)
    dtype = precision.torch_dtype_name
    if lender == cluster.name and dtype == record_dtype and abs(scale - 1.0) < 1e-9:
        return calibrations.load_cluster(lender)
    why = f"{peak.source}, {peak.value / 1e12:g} TFLOP/s {precision.value}, over {lender}'s {record_dtype} "
    why += f"datasheet peak {lender_peak:g} TFLOP/s"
    memory_scale, memory_why = 1.0, ""
    lender_hbm = _cluster_file_value(lender, "hbm_gbps")
    if lender != cluster.name and cluster.hbm_gbps and lender_hbm:
        memory_scale = cluster.hbm_gbps / lender_hbm
        memory_why = (
            f"cluster.hbm_gbps {cluster.hbm_gbps:g} GB/s over {lender}'s datasheet {lender_hbm:g} GB/s"
        )
    return calibrations.load_cluster(
        lender,
        compute_scale=scale,
        borrowed_by=cluster.name,
        scaled_because=why,
        memory_scale=memory_scale,
        memory_because=memory_why,
    )


def _recorded_here(
    cluster: ClusterConfig, name: str, precision: Precision, peak: Figure, *, cuda: bool
) -> calibrations.Calibration:
    """This host's calibration recorded in a file (``cluster.calibration``). Its compute rates serve
    another precision scaled by the ratio of this host's peaks in the two, resolved as the run's
    MFU resolves them (measured on a CPU, the datasheet's on a GPU)."""
    recorded = calibrations.precision_of(calibrations.recorded_dtype_of(name))
    if recorded == precision or peak.value is None:
        return calibrations.load_file(name)
    theirs = _peak(cluster, recorded, cuda=cuda)
    if theirs.value is None:
        return calibrations.load_file(name)
    why = f"this host's {precision.value} peak over its {recorded.value} peak: {peak.source}"
    return calibrations.load_file(name, compute_scale=peak.value / theirs.value, scaled_because=why)


def _calibration(
    cluster: ClusterConfig,
    precision: Precision,
    *,
    cuda: bool,
    ranks_here: int,
    peak: Figure,
    measure: bool = True,
) -> calibrations.Calibration | None:
    """The named cluster's calibration file (its own, or one it borrows), else this host's device:
    recorded in the file ``cluster.calibration`` names, or measured here and cached."""
    if cluster.name != "local":
        lender = cluster.name if calibrations.cluster_file(cluster.name).is_file() else cluster.calibration
        if lender and calibrations.cluster_file(lender).is_file():
            return _recorded(cluster, lender, precision, peak)
        if cluster.device_memory_gb is not None:
            return None  # a named device that is not here, with no calibration: the roofline only
    threads = max(1, (os.cpu_count() or 1) // ranks_here)
    if peak.value is None:
        return None
    if cluster.calibration:  # this host's figures recorded in a file: nothing is measured here
        return _recorded_here(cluster, cluster.calibration, precision, peak, cuda=cuda)
    here = _measure_here(precision, cuda=cuda, threads=threads, ranks_here=ranks_here)
    if not measure:  # the cached figures only: measuring would hold a CUDA context in this process
        here.measure, here.path = None, None
    return here


def resolve_device(
    cluster: ClusterConfig,
    precision: Precision,
    *,
    gpus: int,
    with_peak: bool = True,
    measure_gpu: bool = True,
) -> Device:
    """The device to plan `gpus` ranks on and its node's RAM: the cluster's figures, the rest detected here.

    ``measure_gpu=False``: a GPU's calibration gives its cached figures and measures none (the
    launching process of a run: a measurement would hold a CUDA context there while the ranks run).
    ``with_peak=False`` skips the peak (a CPU measurement costs about half a second): the
    memory check that ``batch.micro_size=auto`` needs does not use it.
    """
    needs_detection = cluster.device_memory_gb is None or cluster.gpus_per_node is None
    cuda = cuda_available() if needs_detection or with_peak else False
    per_node = _gpus_per_node(cluster)
    ranks_here = max(1, min(gpus, int(per_node.value or 1)))
    memory = _memory(cluster, cuda=cuda, ranks_here=ranks_here)
    peak = _peak(cluster, precision, cuda=cuda) if with_peak else Figure(None, "not resolved")
    ring, p2p = rails_bandwidth(cluster)
    return Device(
        name=cluster.name,
        memory_bytes=memory,
        gpus_per_node=per_node,
        host_memory_bytes=_host_memory(cluster),
        peak_flops=peak,
        intra_node_bytes_per_s=_link(cluster, "intra_node_gbps"),
        inter_node_bytes_per_s=ring,
        inter_node_p2p_bytes_per_s=p2p,
        step_latency=step_latency(cluster),
        is_host=cluster.device_memory_gb is None and not cuda,
        calibration=_calibration(
            cluster, precision, cuda=cuda, ranks_here=ranks_here, peak=peak, measure=measure_gpu or not cuda
        )
        if with_peak
        else None,
    )


__all__ = ["Device", "Figure", "host_ram_bytes", "measured_cpu_peak", "resolve_device", "step_latency"]
