"""``summary.json``: the run's status, layout, parameter count and final metrics, written atomically.

A run whose filesystem is full cannot write a new file beside summary.json, so its end would stay
``running``: then the end is written over the old file's own bytes instead, compact, the whole
summary when it fits and the status and error alone when it does not.

Its schema is ``RunSummary``: every key the file holds, typed (a nested record such as
``memory`` is a JSON object whose keys runner/rundir/summary_records.py types, as the module named
at its field writes them). ``schema``
names the version; a summary written before it had one (version 0: the same keys) is read and
upgraded. This module is the file's one writer, one function per phase, each taking that
phase's typed record:

    write_prelaunch    launchers/run_record.py: status running, identity, layout, plan
    write_attempt_end  runner/train/attempt_end.py: rank 0's end of an attempt, what it measured
    write_lost_node    runner/diagnose/peer_loss.py: the node a collective lost
    write_outcome      runner/rundir/outcome.py: the status, whoever decides it
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, get_type_hints

from runner.rundir.atomic_json import strict_json, write_json_atomic
from runner.rundir.json_types import holds, read_json, type_words
from runner.rundir.run_files import SUMMARY_FILE
from runner.rundir.summary_records import (
    CommExposedRecord,
    CompileRecord,
    DeviceMemoryPlan,
    EvalRecord,
    GoodputRecord,
    HostMemoryRecord,
    LossScaleRecord,
    MemoryRecord,
    ModelBuildRecord,
    NoiseScaleRecord,
    PeakCalibrationRecord,
    PipelineRecord,
    SkippedStepsRecord,
    SlurmRecord,
    StepTimeRecord,
    StepTimeSpread,
    TokenizerRecord,
)

SCHEMA_VERSION = 1
# What a run's end records when the full summary cannot be written for want of room.
ESSENTIAL_FIELDS = ("status", "error", "failed_rank", "steps_completed")
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def read_summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary as written, or an empty dict when none was: for what hands it on whole
    (the run's return value, wandb's mirror); a reader of its keys reads ``run_summary``."""
    path = run_dir / SUMMARY_FILE
    if not path.exists():
        return {}
    with path.open() as handle:
        data: dict[str, Any] = json.load(handle)
    return data


class RunStatus(str, Enum):
    """A run's ``status`` in summary.json, spelled as the file holds it; runner/rundir/outcome.py
    decides which, and says who records each."""

    running = "running"  # prelaunch recorded the run; its attempt has not recorded an end
    completed = "completed"  # every step done
    failed = "failed"  # a rank raised or was killed, or its job never ran
    interrupted = "interrupted"  # stopped at a signal; train.resume=auto continues it

    def __str__(self) -> str:
        """The spelling, as ``f"{status}"`` and ``str(status)`` print it (Python's StrEnum does the
        same from 3.11 on; this also runs on 3.10)."""
        return self.value


class SummaryError(ValueError):
    """A summary.json that is not JSON or holds a key of the wrong type."""


Record = dict[str, Any]  # a JSON object: its keys are the writer's named at the field


@dataclass(frozen=True)
class RunSummary:
    """summary.json, typed: every key it holds, by the phase that writes it (None: not recorded)."""

    schema: int = SCHEMA_VERSION
    # The outcome (runner/rundir/outcome.py decides it; prelaunch and the attempt's end write it).
    status: RunStatus | None = None  # None before prelaunch wrote "running"
    error: str | None = None  # why the run did not complete, in words
    failed_rank: int | None = None  # the rank whose failure is the cause
    steps_completed: int | None = None
    # Prelaunch (launchers/run_record.py): the run, its layout, what its plan put where.
    name: str | None = None  # runner/rundir/identity.py
    group: str | None = None
    experiment: str | None = None  # the conf/experiment/ option composed, if any
    model: str | None = None
    parallel: str | None = None
    zero_stage: int | None = None
    precision: str | None = None
    launcher: str | None = None  # local, torchrun, deepspeed, slurm
    layout: dict[str, int] | None = None  # runner/layout.py Layout.to_json
    num_params: int | None = None
    lr: float | None = None  # the learning rate scaled to the global batch
    slurm: SlurmRecord | None = None  # launchers/slurm/job.py; None outside SLURM
    layout_history: list[Record] | None = None  # runner/rundir/layout_history.py
    tokenizer: TokenizerRecord | None = None  # runner/data/tokenizer_dir.py tokenizer_identity
    micro_size_choice: str | None = None  # batch.micro_size=auto: why this micro batch
    plan_warnings: list[str] | None = None
    host_memory: HostMemoryRecord | None = None  # planned at launch, measured at the attempt's end
    device_memory_plan: DeviceMemoryPlan | None = None
    step_time: StepTimeRecord | None = None  # predicted at launch, measured at the attempt's end
    checkpoint_disk: Record | None = None  # runner/checkpoint/size.py DiskNeed.to_json
    # The attempt's end (runner/train/attempt_end.py): what rank 0 measured.
    interruptions: list[Record] | None = None  # each stop at a signal (runner/train/preemption.py)
    final: dict[str, float | None] | None = None  # the last logged step's metrics
    step_time_spread: StepTimeSpread | None = None  # runner/metrics/step_spread.py
    peak_flops_per_device: float | None = None
    peak_flops_source: str | None = None
    peak_flops_calibration: PeakCalibrationRecord | None = None  # runner/hardware/mfu_peak.py
    peak_memory_measure: str | None = None  # runner/hardware/peak_memory.py's label
    cuda_allocator: dict[str, float] | None = None
    memory: MemoryRecord | None = None  # runner/train/attempt_end.py memory_summary (GB = 1e9 bytes)
    accelerator: str | None = None
    model_build: ModelBuildRecord | None = None  # runner/engine/build.py
    compile: CompileRecord | None = None  # runner/engine/compile_blocks.py
    noise_scale: NoiseScaleRecord | None = None  # runner/metrics/noise_scale.py
    comm_exposed: CommExposedRecord | None = None  # runner/metrics/step_probes.py
    pipeline: PipelineRecord | None = None  # runner/train/pipeline_hooks.py
    skipped_steps: SkippedStepsRecord | None = None  # runner/train/nonfinite.py
    fp16_loss_scale: LossScaleRecord | None = None  # runner/engine/fixes/fp16_stage0_loss_scale.py
    resumed_from_step: int | None = None
    profile: Record | None = None  # runner/metrics/step_profiler.py
    wall_time: Record | None = None  # runner/metrics/wall_clock.py
    eval: EvalRecord | None = None  # runner/train/evaluation.py
    goodput: GoodputRecord | None = None  # runner/metrics/goodput.py
    # A diagnosis (runner/diagnose/peer_loss.py): the node a collective lost, and its ranks.
    lost_node: str | None = None
    lost_ranks: list[int] | None = None
    # A full disk: what the compact record over the old bytes left out (``_merge``).
    summary_cut: str | None = None
    # Keys this ladder does not know (a run of another version's), kept as read, read by nothing.
    unknown: Record = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the recorded keys (a None field stays absent)."""
        known = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "unknown"}
        return {**{k: v for k, v in known.items() if v is not None}, **self.unknown}


_HINTS = get_type_hints(RunSummary)
_KEYS = tuple(name for name in _HINTS if name != "unknown")
# What a reader is told a key should hold, where the type alone says too little.
_WORDS = {
    "schema": "an integer version",
    "status": f"one of {', '.join(status.value for status in RunStatus)}",
    "failed_rank": "an integer rank or null",
}


def _fix(path: Path) -> str:
    """What a reader does about a malformed summary."""
    return f"move {path} aside (the run's other files stay readable) or rerun the cell"


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A summary of an older schema as the current one reads it (version 0: no ``schema`` key,
    the same keys otherwise)."""
    return {**data, "schema": SCHEMA_VERSION} if "schema" not in data else data


def parse_summary(data: Any, path: Path) -> RunSummary:
    """``data`` (summary.json's JSON) as a RunSummary, upgraded; SummaryError names the file,
    the key and the fix when it is not one."""
    fix = _fix(path)
    if not isinstance(data, dict):
        raise SummaryError(f"{path}: holds {type(data).__name__}, not a JSON object; {fix}")
    data = _upgrade(data)
    for key in _KEYS:
        value = data.get(key)
        if value is not None and not holds(value, _HINTS[key]):
            words = _WORDS.get(key, type_words(_HINTS[key]))
            raise SummaryError(f"{path}: key {key!r} is {value!r}, expected {words}; {fix}")
    status = data.get("status")
    if status is not None and status not in [known.value for known in RunStatus]:
        raise SummaryError(f"{path}: key 'status' is {status!r}, expected {_WORDS['status']}; {fix}")
    if data["schema"] > SCHEMA_VERSION:
        raise SummaryError(
            f"{path}: key 'schema' is {data['schema']}, newer than this ladder reads ({SCHEMA_VERSION}); "
            "upgrade ladder to read it"
        )
    return RunSummary(
        **{key: data.get(key) for key in _KEYS if key != "status"},
        status=RunStatus(status) if status is not None else None,
        unknown={k: v for k, v in data.items() if k not in _HINTS},
    )


def load_summary(run_dir: Path) -> RunSummary | None:
    """The run's summary through the schema (None when none was written); SummaryError when
    summary.json is not JSON or holds a wrongly typed key."""
    path = run_dir / SUMMARY_FILE
    try:
        data = read_json(path, SummaryError, _fix(path))
    except FileNotFoundError:
        return None
    return parse_summary(data, path)


def run_summary(run_dir: Path) -> RunSummary:
    """The run's summary through the schema; an empty one (every key None) when none was written."""
    return load_summary(run_dir) or RunSummary()


def overwrite_in_place(path: Path, data: Any) -> bool:
    """Write ``data`` as compact JSON over ``path``'s own bytes, padded with spaces to its old
    length, when it fits in the space the file holds already (no new block: a full filesystem
    allows it). Not atomic: the last resort of a full disk. Returns whether it was written."""
    text = json.dumps(strict_json(data), separators=(",", ":"), default=str, allow_nan=False) + "\n"
    encoded = text.encode()
    try:
        held = path.stat()
    except FileNotFoundError:
        return False
    room = max(held.st_size, held.st_blocks * 512)  # a file's last block is held whole
    if len(encoded) > room:
        return False
    padded = encoded + b" " * (held.st_size - len(encoded))  # trailing spaces are valid JSON
    with path.open("r+b") as handle:
        handle.write(padded)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _merge(run_dir: Path, written: dict[str, Any]) -> dict[str, Any]:
    """Merge one phase's keys into summary.json (created if absent) and return the result.

    With no room for a new file, the result is written over the old one (the status and error
    alone when the whole does not fit there); with no room for that either, the error is raised."""
    path = run_dir / SUMMARY_FILE
    summary = read_summary(run_dir)
    before = dict(summary)
    summary.update(written)
    if not before:  # a new summary names its schema; an older run's keeps its own (read: _upgrade)
        summary = {"schema": SCHEMA_VERSION, **summary}
    try:
        write_json_atomic(path, summary)
    except OSError as error:
        if error.errno not in NO_ROOM:
            raise
        essential = {key: summary[key] for key in ESSENTIAL_FIELDS if key in summary}
        cut = {
            **before,
            **essential,
            "summary_cut": f"the filesystem was full ({error.strerror}): only the run's status was recorded",
        }
        if not (overwrite_in_place(path, summary) or overwrite_in_place(path, cut)):
            raise
    return summary


def _keys(record: Any, *, omitted_when_none: tuple[str, ...] = ()) -> dict[str, Any]:
    """A phase record's keys as summary.json holds them, in its fields' order (shallow: the
    records inside stay the objects their writers made)."""
    out = {f.name: getattr(record, f.name) for f in fields(record)}
    return {k: v for k, v in out.items() if not (v is None and k in omitted_when_none)}


@dataclass(frozen=True)
class Outcome:
    """A run's status and why (runner/rundir/outcome.py decides it)."""

    status: RunStatus
    error: str | None = None
    failed_rank: int | None = None  # written only when known: a later record keeps the cause's

    def keys(self) -> dict[str, Any]:
        """summary.json's outcome keys, the status as its JSON string (the summary handed on whole
        holds what the file holds)."""
        return {**_keys(self, omitted_when_none=("failed_rank",)), "status": self.status.value}


@dataclass(frozen=True)
class Prelaunch:
    """What the launching process records before the ranks start (launchers/run_record.py)."""

    outcome: Outcome  # running
    name: str
    group: str | None
    experiment: str | None
    model: str
    parallel: str
    zero_stage: int
    precision: str
    launcher: str
    layout: dict[str, int]
    num_params: int
    lr: float
    slurm: SlurmRecord | None
    layout_history: list[Record]
    tokenizer: TokenizerRecord | None  # absent without data.tokenizer
    micro_size_choice: str | None  # absent unless batch.micro_size=auto
    plan_warnings: list[str]
    host_memory: HostMemoryRecord
    device_memory_plan: DeviceMemoryPlan
    step_time: StepTimeRecord
    checkpoint_disk: Record


@dataclass(frozen=True)
class AttemptEnd:
    """What rank 0 records at its attempt's end, however it ended (runner/train/attempt_end.py)."""

    outcome: Outcome | None  # None: another rank failed first and recorded why
    interruptions: list[Record] | None  # absent unless this attempt stopped at a signal
    steps_completed: int
    final: dict[str, float | None]
    step_time_spread: StepTimeSpread | None
    step_time: StepTimeRecord | None
    peak_flops_per_device: float
    peak_flops_source: str
    peak_flops_calibration: PeakCalibrationRecord | None
    peak_memory_measure: str
    cuda_allocator: dict[str, float] | None
    host_memory: HostMemoryRecord
    memory: MemoryRecord
    accelerator: str
    model_build: ModelBuildRecord
    compile: CompileRecord | None
    noise_scale: NoiseScaleRecord
    comm_exposed: CommExposedRecord
    pipeline: PipelineRecord | None
    skipped_steps: SkippedStepsRecord
    fp16_loss_scale: LossScaleRecord | None
    resumed_from_step: int | None
    profile: Record | None
    wall_time: Record
    eval: EvalRecord | None
    goodput: GoodputRecord | None


def write_prelaunch(run_dir: Path, record: Prelaunch) -> None:
    """The prelaunch phase's one write: status running, the run, its layout, history and plan."""
    keys = _keys(record, omitted_when_none=("tokenizer", "micro_size_choice"))
    _merge(run_dir, {**record.outcome.keys(), **{k: v for k, v in keys.items() if k != "outcome"}})


def write_attempt_end(run_dir: Path, record: AttemptEnd) -> dict[str, Any]:
    """Rank 0's one write at its attempt's end; returns the summary as written."""
    keys = _keys(record, omitted_when_none=("interruptions",))
    outcome = record.outcome.keys() if record.outcome is not None else {}
    return _merge(run_dir, {**outcome, **{k: v for k, v in keys.items() if k != "outcome"}})


def write_lost_node(run_dir: Path, *, node: str, ranks: tuple[int, ...]) -> None:
    """The node whose connection a collective lost, and its ranks (runner/diagnose/peer_loss.py)."""
    _merge(run_dir, {"lost_node": node, "lost_ranks": list(ranks)})


def write_outcome(run_dir: Path, outcome: Outcome) -> dict[str, Any]:
    """The run's status and why (runner/rundir/outcome.py, its only caller); returns the summary."""
    return _merge(run_dir, outcome.keys())
