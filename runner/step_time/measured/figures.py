"""The constants of the step-time model: what one device was measured to reach, where and when.

The step-time model (runner/step_time/estimate.py, its terms priced by runner/step_time/calibrated_terms.py
and micro_batch_compute.py) asks a :class:`Calibration` for the rate of a GEMM at its shape,
the time of the attention kernel at its shape, the bandwidth of a memory-bound kernel at its
size, an eager op's dispatch time, the fused AdamW's bandwidth and a collective's latency and
bandwidth. It answers from one of two places:

- **this host's device** (``cluster=local``, or a named cluster's figures left unset): the
  micro-benchmarks of runner/hardware/calibrate.py, run here with the threads a rank will
  have, the first time a figure is asked for, and cached per device in
  ``$LADDER_CACHE_DIR/calibration/`` (default ``~/.cache/ladder``), by the method's version
  (:data:`METHOD_VERSION`). A plan of a new model
  shape measures its GEMMs once, in about a second on a CPU.
- **a named cluster's calibration file**, ``conf/cluster/calibration/<name>.json``, recorded
  on such a device by ``python bench/calibrate_device.py --cluster <name>``. It says where and
  when it was measured. A shape the file lacks takes the rate of its nearest measured shape
  (by log distance of M, K and N). A cluster with no file of its own may borrow another's
  (``calibration: <name>`` in its conf/cluster YAML): compute rates are then scaled by the
  ratio of the two datasheet peaks, and the memory-bound figures (copies, the optimizer, a
  block's non-GEMM part above its dispatch floor, the loss) by the ratio of the two devices'
  memory bandwidths (``cluster.hbm_gbps``), and the source says so.

A figure measured while other processes held the cores is cached too, marked provisional: it
serves every plan meanwhile, and the first later plan that finds the host quiet measures it again.
On a CPU each figure also keeps the pace of a fixed reference timed just before and after it
(runner/hardware/host_pace.py): a figure whose reference ran slow against the fastest reading
this host has given, in this plan or any before it, is provisional in the same way, since a
VM's slow phases leave the cores looking quiet.
A figure neither measured nor recorded is None; the step-time model then says which term it
could not predict.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.config import Precision
from runner.hardware import host_pace
from runner.step_time.measured import zero3_overhead as calibrate_zero3

CALIBRATION_GROUP = Path(__file__).resolve().parents[3] / "conf" / "cluster" / "calibration"
CACHE_ENV = "LADDER_CACHE_DIR"
# The micro-benchmarks' method, in the cache file's name: raised whenever a measurement changes
# what it measures (3: ZeRO's engine figures with denormals flushed, ranks on jemalloc with any
# extent reused; 4: ZeRO's engine figures on transformer blocks, stages 0 to 2 timed before any
# stage-3 engine exists), so that a host's figures measured the old way are measured again.
METHOD_VERSION = 4


def cache_dir() -> Path:
    """Where this host's calibrations are cached: $LADDER_CACHE_DIR/calibration (~/.cache/ladder/...)."""
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ladder")
    return Path(base) / "calibration"


def _key(*numbers: int) -> str:
    return ",".join(str(int(n)) for n in numbers)


def _unkey(key: str) -> tuple[int, ...]:
    return tuple(int(part) for part in key.split(","))


def _pace_name(kind: str, key: str) -> str:
    """A figure's name in a calibration's ``paces``: "kind|shape key"."""
    return f"{kind}|{key}"


def _nearest(table: dict[str, Any], wanted: tuple[int, ...]) -> tuple[tuple[int, ...], Any] | None:
    """The entry whose key is nearest ``wanted`` in log space, with its key; None when empty."""
    best: tuple[float, tuple[int, ...], Any] | None = None
    for key, value in table.items():
        shape = _unkey(key)
        if len(shape) != len(wanted):
            continue
        distance = sum(math.log(max(a, 1) / max(b, 1)) ** 2 for a, b in zip(shape, wanted, strict=True))
        if best is None or distance < best[0]:
            best = (distance, shape, value)
    return None if best is None else (best[1], best[2])


def floor_shape(heads: int, kv_heads: int) -> tuple[int, int, int, int, int, int]:
    """The trivial (micro, seq, d, heads, kv heads, ffn) whose non-GEMM part runs the same ops as a
    block of ``heads`` and ``kv_heads`` (GQA's repeat where it has one): their dispatch floor."""
    rep = max(1, heads // max(1, kv_heads))
    return (1, 8, 8 * rep, rep, 1, 16)


def _found(table: dict[str, Any], wanted: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``_figure`` answered ``wanted`` from: itself where recorded, else its nearest."""
    if _key(*wanted) in table:
        return wanted
    near = _nearest(table, wanted)
    return wanted if near is None else near[0]


@dataclass
class Calibration:
    """Measured figures of one device; see the module docstring for where each comes from."""

    device: str  # e.g. "NVIDIA H200", "cpu x86_64"
    dtype: str  # the compute dtype the GEMMs and kernels were timed in
    threads: int  # torch intra-op threads while measuring (a CPU rank's; 0: not a CPU)
    torch: str
    measured: str  # ISO 8601, UTC, of the first figure
    where: str  # the host it was measured on
    gemms: dict[str, list[float]] = field(default_factory=dict)  # "m,k,n": [fwd, dX, dW] FLOP/s
    attention: dict[str, list[float]] = field(default_factory=dict)  # "b,h,s,d": [fwd s, bwd s]
    copies: dict[str, float] = field(default_factory=dict)  # "bytes": read + written per s
    op_s: float | None = None  # one eager op, forward and backward
    blocks: dict[str, float] = field(default_factory=dict)  # "micro,seq,d,heads,kv heads,ffn": fwd+bwd s
    adamw: dict[str, float] = field(default_factory=dict)  # "numel": fused AdamW bytes/s (28 B a param)
    # one block's non-GEMM part, fwd+bwd s, eager and compiled (runner/step_time/measured/block_timing.py
    # ``rest_seconds``): "micro,seq,d,heads,kv heads,ffn"
    rest: dict[str, float] = field(default_factory=dict)
    rest_compiled: dict[str, float] = field(default_factory=dict)
    cross_entropy: dict[str, float] = field(default_factory=dict)  # "tokens,vocab": the loss fwd+bwd s
    fresh_bytes_per_s: float | None = None  # zeroing fresh large CPU allocations (page faults); GPU: None
    allreduce: list[float] | None = None  # [latency s, bytes/s], two ranks
    allgather: list[float] | None = None  # [latency s, bytes/s received], two ranks
    # ZeRO-3 per micro-batch, one rank (runner/step_time/measured/zero3_overhead.py): its module hooks' cost
    # per parameter tensor visited, persistent or not, and a gather's own cost per gathered tensor
    zero3_hook_s: float | None = None
    zero3_gather_s: float | None = None
    # DeepSpeed's engine over a bare loop, per parameter tensor and micro-batch, by ZeRO stage
    engine_param_s: dict[str, float] | None = None
    compute_scale: float = 1.0  # a borrowed calibration's peak ratio (see the module docstring)
    memory_scale: float = 1.0  # a borrowed calibration's memory-bandwidth ratio (the same)
    # figure -> the micro-benchmark that measured it (a file's ``sources``)
    sources: dict[str, str] = field(default_factory=dict)
    # figure -> {"summary": words, "method": ..., "data": [...]}: a figure fitted to measured steps,
    # not measured by a micro-benchmark (a file's ``fitted``)
    fitted: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # in words: measured here (cached where), or the file and its origin
    # (figure, measured on a quiet host) for a kind and shape; None: a file, nothing is measured
    measure: Callable[[str, tuple[int, ...]], tuple[Any, bool]] | None = field(
        default=None, repr=False, compare=False
    )
    path: Path | None = field(default=None, repr=False, compare=False)  # where new figures are saved
    # whether the host is quiet now (a local device's): a provisional figure is measured again then
    quiet: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    # a CPU's caps on what it measures (None: none), stated in the terms that use them
    gemm_cap_flops: float | None = field(default=None, repr=False, compare=False)
    block_cap_params: float | None = field(default=None, repr=False, compare=False)
    # a CPU's cap on the elements of the largest tensor of a non-GEMM or loss measurement
    rest_cap_elements: int | None = field(default=None, repr=False, compare=False)
    _measured: set[str] = field(default_factory=set, repr=False, compare=False)
    # (kind, shape key) of figures measured on a busy host: cached, used, and provisional, that is
    # measured again by the first later plan that finds the host quiet
    provisional: set[tuple[str, str]] = field(default_factory=set, repr=False, compare=False)
    _retried: set[tuple[str, str]] = field(default_factory=set, repr=False, compare=False)
    # "kind|shape key" -> the host's reference seconds around that figure, the slower of before and
    # after (runner/hardware/host_pace.py), and the fastest reference this host has given
    paces: dict[str, float] = field(default_factory=dict)
    fastest_pace: float | None = None
    # times the reference now (a CPU's calibration; None: a GPU or a file, nothing paced)
    pace_now: Callable[[], float] | None = field(default=None, repr=False, compare=False)

    def _pace(self) -> float | None:
        """The reference timed now (None: not paced), the host's fastest updated by it."""
        if self.pace_now is None:
            return None
        seconds = self.pace_now()
        self.fastest_pace = seconds if self.fastest_pace is None else min(self.fastest_pace, seconds)
        return seconds

    def _ran_slow(self, kind: str, key: str) -> bool:
        """Whether this figure's reference ran slow against the fastest reading known now."""
        pace = self.paces.get(_pace_name(kind, key))
        return pace is not None and host_pace.slow(pace, self.fastest_pace)

    def _pending(self, kind: str, key: str) -> bool:
        """Whether this figure is to be measured again on a quiet host: measured busy, or slow."""
        return (kind, key) in self.provisional or self._ran_slow(kind, key)

    def pending(self) -> set[tuple[str, str]]:
        """The figures to measure again on a quiet host: measured busy, or in a slow phase."""
        figures = (name.partition("|") for name in self.paces)
        return self.provisional | {(kind, key) for kind, _, key in figures if self._ran_slow(kind, key)}

    def _host_quiet(self) -> bool:
        """No other process holds the cores, and the reference runs at the host's pace, now."""
        if self.quiet is None or not self.quiet():
            return False
        pace = self._pace()
        return pace is None or not host_pace.slow(pace, self.fastest_pace)

    def _stale(self, kind: str, key: str) -> bool:
        """A provisional figure not yet measured again in this process, on a host now quiet."""
        if not self._pending(kind, key) or (kind, key) in self._retried or self.measure is None:
            return False
        self._retried.add((kind, key))
        return self._host_quiet()

    def _measure(self, kind: str, shape: tuple[int, ...]) -> Any:
        """Measure now, cache it, and mark it provisional when the host was busy or slow meanwhile."""
        assert self.measure is not None
        before = self._pace()
        value, quiet = self.measure(kind, shape)
        after = self._pace()
        key = (kind, _key(*shape) if shape else "")
        if before is not None and after is not None:
            self.paces[_pace_name(*key)] = max(before, after)
        if quiet and not self._ran_slow(*key):
            self.provisional.discard(key)
        else:
            self.provisional.add(key)
        return value

    def _figure(self, table: dict[str, Any], kind: str, shape: tuple[int, ...]) -> tuple[Any, float]:
        """The figure at ``shape``, measured now if this is the local device, else the nearest
        recorded one; with the ratio (wanted / found) of the shapes' sizes. (None, 1) when none."""
        key = _key(*shape)
        if self.measure is not None and (key not in table or self._stale(kind, key)):
            table[key] = self._measure(kind, shape)
            self.save()
        if key in table:
            return table[key], 1.0
        near = _nearest(table, shape)
        if near is None:
            return None, 1.0
        return near[1], math.prod(shape) / max(1, math.prod(near[0]))

    def gemm(self, m: int, k: int, n: int) -> tuple[float, float, float] | None:
        """FLOP/s of the forward, input-gradient and weight-gradient GEMMs at (m, k, n)."""
        rates, _ = self._figure(self.gemms, "gemm", (m, k, n))
        if rates is None:
            return None
        return (rates[0] * self.compute_scale, rates[1] * self.compute_scale, rates[2] * self.compute_scale)

    def attention_s(self, batch: int, heads: int, seq: int, head_dim: int) -> tuple[float, float] | None:
        """Seconds of causal attention's forward and backward at (batch, heads, seq, head_dim).

        A recorded shape other than this one is scaled by the ratio of the FLOPs, 4 b h s^2 d.
        """
        seconds, _ = self._figure(self.attention, "attention", (batch, heads, seq, head_dim))
        if seconds is None:
            return None
        near = _nearest(self.attention, (batch, heads, seq, head_dim))
        ratio = 1.0
        if near is not None and _key(*near[0]) != _key(batch, heads, seq, head_dim):
            b, h, s, d = near[0]
            ratio = (batch * heads * seq * seq * head_dim) / max(1, b * h * s * s * d)
        return (seconds[0] * ratio / self.compute_scale, seconds[1] * ratio / self.compute_scale)

    def block_seconds(
        self, micro: int, seq: int, d_model: int, heads: int, kv_heads: int, ffn: int
    ) -> float | None:
        """One transformer block's forward and backward, timed whole
        (runner/step_time/measured/block_timing.py); only at this exact shape (None: a file that
        did not time it)."""
        shape = (micro, seq, d_model, heads, kv_heads, ffn)
        if _key(*shape) not in self.blocks and (self.measure is None or self.block_too_large(shape)):
            return None
        seconds, _ = self._figure(self.blocks, "block", shape)
        return seconds

    def _capped_tokens(self, micro: int, seq: int, width: int) -> tuple[int, int]:
        """(micro, seq) halved, micro first, until micro x seq x ``width`` is under the CPU's cap."""
        cap = self.rest_cap_elements
        while cap is not None and micro * seq * width > cap and (micro > 1 or seq > 8):
            if micro > 1:
                micro //= 2
            else:
                seq //= 2
        return micro, seq

    def rest_seconds(
        self, micro: int, seq: int, d_model: int, heads: int, kv_heads: int, ffn: int, *, compiled: bool
    ) -> tuple[float, float, str] | None:
        """One block's non-GEMM part, forward and backward (runner/step_time/measured/block_timing.py
        ``rest_seconds``): (seconds at this shape, seconds at a trivial shape of the same ops: their
        dispatch floor, how it was had). A CPU measures at most ``rest_cap_elements`` a tensor
        (compiled: at micro 1) and scales the part above the floor by the tokens; a file takes its
        nearest recorded shape, scaled by the tokens and widths above the floor. None: neither
        measured nor recorded."""
        table, kind = (self.rest_compiled, "rest_compiled") if compiled else (self.rest, "rest")
        shape = (micro, seq, d_model, heads, kv_heads, ffn)
        trivial = floor_shape(heads, kv_heads)
        if self.measure is None and not table:
            return None
        at_micro, at_seq = self._capped_tokens(micro, seq, max(d_model, ffn))
        if compiled and self.rest_cap_elements is not None:
            at_micro = 1  # a CPU compiles once a shape (a minute): every micro-batch size shares micro 1
        measured_shape = (at_micro, at_seq, d_model, heads, kv_heads, ffn)
        floor, _ = self._figure(table, kind, trivial)
        found, _ = self._figure(table, kind, measured_shape)
        if found is None:
            return None
        near_shape = _found(table, measured_shape)
        floor = min(float(floor or 0.0), float(found))
        nm, ns, nd, _, _, nf = near_shape
        scale = (micro * seq * (3 * d_model + ffn)) / max(1, nm * ns * (3 * nd + nf)) / self.memory_scale
        where = "measured" if self.measure is not None else "recorded"
        words = f"{where} at this shape"
        if near_shape != shape:
            words = f"{where} at {_key(*near_shape)}, scaled by the tokens and widths"
        return floor + (float(found) - floor) * scale, floor, words

    def cross_entropy_s(self, tokens: int, vocab: int) -> tuple[float, str] | None:
        """The loss's forward and backward over (tokens, vocab) logits
        (runner/step_time/measured/block_timing.py ``cross_entropy_seconds``), scaled by the
        elements from a capped or nearest shape; None: none."""
        if self.measure is None and not self.cross_entropy:
            return None
        at_tokens, _ = self._capped_tokens(tokens, 1, vocab) if self.rest_cap_elements else (tokens, 1)
        found, _ = self._figure(self.cross_entropy, "cross_entropy", (at_tokens, vocab))
        if found is None:
            return None
        near = _found(self.cross_entropy, (at_tokens, vocab))
        where = "measured" if self.measure is not None else "recorded"
        words = f"{where} at this shape"
        if near != (tokens, vocab):
            words = f"{where} at (tokens, vocab) {_key(*near)}, scaled by the elements"
        return float(found) * tokens * vocab / max(1, near[0] * near[1]) / self.memory_scale, words

    def block_too_large(self, shape: tuple[int, ...]) -> bool:
        """Whether a block of (micro, seq, d_model, heads, kv heads, ffn) is past the CPU's cap
        on the blocks it times whole (its parameters: q, o at d^2, k, v at d x kv width, 3 d x ffn)."""
        if self.block_cap_params is None:
            return False
        _, _, d, heads, kv_heads, ffn = shape
        return 2 * d * d + 2 * d * (d * kv_heads // heads) + 3 * d * ffn > self.block_cap_params

    def describe(self) -> str:
        """Where the figures came from, and how many are provisional (measured on a busy or slow host)."""
        pending = self.pending()
        if not pending:
            return self.source
        return (
            f"{self.source}; {len(pending)} figure(s) measured while other processes held the cores or "
            "the host ran slow: provisional, measured again by a plan on a quiet host"
        )

    def copy_rate(self, num_bytes: float) -> float | None:
        """Bytes read plus written per second by a memory-bound kernel over ``num_bytes`` bytes
        (measured at the power of two nearest it, at most 256 MiB)."""
        size = 2 ** min(28, max(10, round(math.log2(max(num_bytes, 1.0)))))  # 256 MiB: past every cache
        rate, _ = self._figure(self.copies, "copy", (size,))
        return None if rate is None else rate * self.memory_scale

    def _once(self, name: str) -> Any:
        if (
            self.measure is not None
            and name not in self._measured
            and (getattr(self, name) is None or self._stale(name, ""))
        ):
            self._measured.add(name)  # a device without this figure (a GPU's all-reduce) asks once
            setattr(self, name, self._measure(name, ()))
            self.save()
        return getattr(self, name)

    def op_seconds(self) -> float | None:
        """One eager op's dispatch, forward and backward."""
        return self._once("op_s")

    def adamw_rate(self, numel: int) -> float | None:
        """Fused AdamW's bytes per second (28 B a parameter) on ``numel`` parameters (measured at the
        power of two nearest it, at most 2^25: 512 MiB of fp32 states, past every cache)."""
        size = 2 ** min(25, max(12, round(math.log2(max(numel, 1)))))
        rate, _ = self._figure(self.adamw, "adamw", (size,))
        return None if rate is None else rate * self.memory_scale

    def fresh_rate(self) -> float | None:
        """Bytes per second into freshly allocated large CPU tensors (None: not a CPU, or unmeasured)."""
        return self._once("fresh_bytes_per_s")

    def allreduce_costs(self) -> tuple[float, float] | None:
        """(latency s, bytes/s sent per rank) of a two-rank all-reduce."""
        costs = self._once("allreduce")
        return None if costs is None else (float(costs[0]), float(costs[1]))

    def allgather_costs(self) -> tuple[float, float] | None:
        """(latency s, bytes/s received per rank) of a two-rank all-gather."""
        costs = self._once("allgather")
        return None if costs is None else (float(costs[0]), float(costs[1]))

    def zero3_hook_seconds(self) -> float | None:
        """Seconds of ZeRO-3's module hooks per parameter tensor visited per micro-batch, forward and
        backward, persistent tensors included (runner/step_time/measured/zero3_overhead.py): a file's figure,
        else the engine's all-persistent stage-3 figure less stage 0's; None where neither is."""
        if self.zero3_hook_s is not None:
            return self.zero3_hook_s
        engine = self.engine_param_seconds()
        if engine is None or calibrate_zero3.PERSISTENT_KEY not in engine:
            return None
        return max(0.0, engine[calibrate_zero3.PERSISTENT_KEY] - engine.get("0", 0.0))

    def zero3_gather_seconds(self) -> float | None:
        """Seconds ZeRO-3 adds per gathered (not persistent) parameter tensor per micro-batch beyond
        the hooks: a file's figure, else the engine's stage 3 less its all-persistent stage 3 (a
        record without that: stage 3 less stage 0, all of it per gathered tensor)."""
        if self.zero3_gather_s is not None:
            return self.zero3_gather_s
        engine = self.engine_param_seconds()
        if engine is None or "3" not in engine:
            return None
        below = engine.get(calibrate_zero3.PERSISTENT_KEY, engine.get("0", 0.0))
        return max(0.0, engine["3"] - below)

    def fitted_words(self, figure: str) -> str | None:
        """In words, what ``figure`` was fitted to (None: a micro-benchmark measured it)."""
        fit = self.fitted.get(figure)
        if fit is None:
            return None
        return str(fit.get("summary") or fit.get("method") or "fitted to measured steps")

    def zero3_byte_seconds(self) -> float | None:
        """Seconds ZeRO-3 adds per byte of a gathered tensor per micro-batch, beyond its per-tensor
        figure (runner/step_time/measured/zero3_overhead.py ``BYTE_KEY``); None where it was not measured."""
        return (self.engine_param_seconds() or {}).get(calibrate_zero3.BYTE_KEY)

    def engine_param_seconds(self) -> dict[str, float] | None:
        """Seconds DeepSpeed's engine adds to a bare forward and backward per parameter tensor per
        micro-batch, by ZeRO stage ("0" to "3", and stage 3 all-persistent;
        runner/step_time/measured/zero3_overhead.py). A cache from before the all-persistent run is measured
        again, once."""
        stale = (
            isinstance(self.engine_param_s, dict)
            and calibrate_zero3.PERSISTENT_KEY not in self.engine_param_s
        )
        if stale and self.measure is not None and "engine_param_s" not in self._measured:
            self.engine_param_s = None
        figures = self._once("engine_param_s")
        return None if figures is None else {str(k): float(v) for k, v in figures.items()}

    def to_json(self) -> dict[str, Any]:
        """The calibration as its JSON file keeps it."""
        keep = (
            "device",
            "dtype",
            "threads",
            "torch",
            "measured",
            "where",
            "gemms",
            "attention",
            "copies",
            "blocks",
            "adamw",
            "rest",
            "rest_compiled",
            "cross_entropy",
        )
        out = {name: getattr(self, name) for name in keep}
        out.update(
            op_s=self.op_s,
            fresh_bytes_per_s=self.fresh_bytes_per_s,
            allreduce=self.allreduce,
            allgather=self.allgather,
            zero3_hook_s=self.zero3_hook_s,
            zero3_gather_s=self.zero3_gather_s,
            engine_param_s=self.engine_param_s,
        )
        if self.sources:
            out["sources"] = dict(self.sources)
        if self.fitted:
            out["fitted"] = dict(self.fitted)
        out["provisional"] = sorted([kind, key] for kind, key in self.provisional)
        if self.paces:
            out.update(paces=dict(self.paces), fastest_pace=self.fastest_pace)
        return out

    def save(self) -> None:
        """Write the figures to ``path`` (a local device's cache); an unwritable file is skipped."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))
            temporary.replace(self.path)
        except OSError:
            pass  # a read-only home: the figures stay in this process


def from_record(
    record: dict[str, Any], *, source: str, compute_scale: float = 1.0, memory_scale: float = 1.0
) -> Calibration:
    """A calibration from its JSON record (a file's, or this host's cache)."""
    return Calibration(
        device=str(record.get("device", "")),
        dtype=str(record.get("dtype", "")),
        threads=int(record.get("threads") or 0),
        torch=str(record.get("torch", "")),
        measured=str(record.get("measured", "")),
        where=str(record.get("where", "")),
        gemms=dict(record.get("gemms") or {}),
        attention=dict(record.get("attention") or {}),
        copies=dict(record.get("copies") or {}),
        op_s=record.get("op_s"),
        blocks=dict(record.get("blocks") or {}),
        adamw=dict(record.get("adamw") or {}),
        rest=dict(record.get("rest") or {}),
        rest_compiled=dict(record.get("rest_compiled") or {}),
        cross_entropy=dict(record.get("cross_entropy") or {}),
        fresh_bytes_per_s=record.get("fresh_bytes_per_s"),
        allreduce=record.get("allreduce"),
        allgather=record.get("allgather"),
        zero3_hook_s=record.get("zero3_hook_s"),
        # an older record's ``zero3_param_s`` was all of ZeRO-3's cost per gathered tensor
        zero3_gather_s=record.get("zero3_gather_s", record.get("zero3_param_s")),
        engine_param_s=record.get("engine_param_s"),
        sources=dict(record.get("sources") or {}),
        fitted=dict(record.get("fitted") or {}),
        compute_scale=compute_scale,
        memory_scale=memory_scale,
        source=source,
        provisional={(str(kind), str(key)) for kind, key in record.get("provisional") or []},
        paces={str(name): float(seconds) for name, seconds in (record.get("paces") or {}).items()},
        fastest_pace=record.get("fastest_pace"),
    )


def cluster_file(name: str) -> Path:
    """conf/cluster/calibration/<name>.json."""
    return CALIBRATION_GROUP / f"{name}.json"


def named_file(name: str) -> Path:
    """A calibration as ``cluster.calibration`` names it: a path to its JSON file (ending in .json,
    or naming a folder), else an option of conf/cluster/calibration/."""
    if name.endswith(".json") or os.sep in name:
        return Path(name).expanduser()
    return cluster_file(name)


def file_problem(name: str) -> str | None:
    """Why ``cluster.calibration=name`` cannot be read as a calibration (None: it can)."""
    path = named_file(name)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return f"cluster.calibration={name}: no such calibration file ({path})"
    except (OSError, ValueError) as error:
        return f"cluster.calibration={name}: {path} is not a calibration's JSON ({error})"
    if not isinstance(record, dict) or record.get("dtype") not in {"float32", "bfloat16", "float16"}:
        return f"cluster.calibration={name}: {path} names no dtype (float32, bfloat16 or float16)"
    return None


def precision_of(dtype: str) -> Precision:
    """The precision whose compute dtype torch names ``dtype`` (``Precision.torch_dtype_name``'s
    inverse); bf16 for any other name."""
    return {precision.torch_dtype_name: precision for precision in Precision}.get(dtype, Precision.bf16)


def load_file(name: str, *, compute_scale: float = 1.0, scaled_because: str = "") -> Calibration:
    """This host's figures from a recorded file instead of measured here (``cluster=local
    cluster.calibration=FILE``): nothing is measured; a shape the file lacks takes its nearest."""
    path = named_file(name)
    # what a cache kept about its own measurement (busy or slow figures) is no file's concern
    kept = ("provisional", "paces", "fastest_pace")
    record = {key: value for key, value in json.loads(path.read_text()).items() if key not in kept}
    source = (
        f"calibration file {path}: recorded on {record.get('device')} ({record.get('where')}) in "
        f"{record.get('dtype')} at {record.get('threads')} thread(s), {record.get('measured')}; "
        "nothing measured here"
    )
    if scaled_because:
        source += f"; compute scaled by {compute_scale:.3g} ({scaled_because})"
    return from_record(record, source=source, compute_scale=compute_scale)


def recorded_dtype_of(name: str) -> str:
    """The dtype the calibration file ``cluster.calibration`` names timed its kernels in."""
    return str(json.loads(named_file(name).read_text()).get("dtype", ""))


def recorded_dtype(name: str) -> str:
    """The dtype a named cluster's calibration file timed its kernels in ("" without a file)."""
    path = cluster_file(name)
    return str(json.loads(path.read_text()).get("dtype", "")) if path.is_file() else ""


def load_cluster(
    name: str,
    *,
    compute_scale: float = 1.0,
    borrowed_by: str | None = None,
    scaled_because: str = "",
    memory_scale: float = 1.0,
    memory_because: str = "",
) -> Calibration | None:
    """A named cluster's recorded calibration (None: it has no file); ``compute_scale`` and its
    reason (``scaled_because``) where it serves another device or precision, ``memory_scale`` and
    its reason (``memory_because``) where it serves a device of another memory bandwidth."""
    path = cluster_file(name)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    words = f"recorded on {record.get('device')} ({record.get('where')}) in {record.get('dtype')}, "
    source = f"calibration file conf/cluster/calibration/{name}.json: {words}{record.get('measured')}"
    if borrowed_by is not None:
        whose = "its own" if borrowed_by == name else f"cluster {name}'s"
        memory = (
            f"memory-bound figures scaled by {memory_scale:.3g} ({memory_because})"
            if memory_because
            else "bandwidths as measured there"
        )
        source = (
            f"cluster {borrowed_by} uses {whose} calibration, compute scaled by {compute_scale:.3g} "
            f"({scaled_because}), {memory}; {source}"
        )
    return from_record(record, source=source, compute_scale=compute_scale, memory_scale=memory_scale)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def local(
    device: str,
    dtype: str,
    threads: int,
    torch_version: str,
    measure: Callable[[str, tuple[int, ...]], tuple[Any, bool]],
    quiet: Callable[[], bool] | None = None,
    pace_now: Callable[[], float] | None = None,
) -> Calibration:
    """This host's device: its cache, measured further on demand by ``measure(kind, shape)``;
    a provisional figure measured again where ``quiet()`` says the host is quiet now. ``pace_now``
    (a CPU's) times the host's reference beside each figure; a cache of paced figures is paced once
    on loading, so that figures measured in a slow phase are found by a later, faster plan."""
    name = f"{device}-{dtype}-{threads}t-torch{torch_version}-method{METHOD_VERSION}"
    path = cache_dir() / f"{_slug(name)}.json"
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record: dict[str, Any] = {}
    if path.is_file():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {}  # a damaged cache is measured again
    record.update(device=device, dtype=dtype, threads=threads, torch=torch_version)
    record.setdefault("measured", now)
    record.setdefault("where", platform.node())
    source = (
        f"measured on this host ({device}, {dtype}, {threads} thread(s)) since {record['measured']}; "
        f"cached in {path}"
    )
    calibration = from_record(record, source=source)
    calibration.measure, calibration.path, calibration.quiet = measure, path, quiet
    calibration.pace_now = pace_now
    if calibration.paces:
        calibration._pace()
    return calibration


__all__ = [
    "CACHE_ENV",
    "Calibration",
    "cache_dir",
    "cluster_file",
    "file_problem",
    "floor_shape",
    "from_record",
    "load_cluster",
    "load_file",
    "local",
    "named_file",
    "precision_of",
    "recorded_dtype",
    "recorded_dtype_of",
]
