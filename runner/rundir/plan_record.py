"""``plan.json``: what a plan put where, typed, versioned like summary.json, written and read here.

The planner (runner/plan/planner.py ``Plan.record``) makes a :class:`PlanRecord`; ``plan=true``
(launchers/plan_job.py) adds the disk, the resume, the longest sequences, the ladder and the
exit code and writes it; ``ladder report`` (runner/report/collect.py) reads it back through
:func:`load_plan`, which names the file, the key and the fix when a key holds the wrong type.
Units: bytes, seconds, FLOP/s. A record written by a writer module (the host plan, the disk, the
ladder) is a JSON object shaped by the module named at its field.

``schema`` names the version: a plan.json written before it had one (version 0: the same keys)
is read as version 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from runner.rundir.atomic_json import write_json_atomic
from runner.rundir.json_types import holds, read_json, type_words
from runner.rundir.run_files import PLAN_FILE

PLAN_SCHEMA_VERSION = 1

Record = dict[str, Any]  # a JSON object: its keys are the writer's named at the field


@dataclass(frozen=True)
class PlannedModel:
    """The model planned: its name and parameter count."""

    name: str
    num_params: int


@dataclass(frozen=True)
class PlannedKnobs:
    """The layout choices planned (runner/step_time/workload.py Knobs)."""

    parallel: str
    zero_stage: int
    recompute: str
    offload: str
    overlap_comm: bool
    micro_size: int | str  # "auto" where the plan chose it


@dataclass(frozen=True)
class PlannedDevice:
    """What the plan assumed of one device, each figure with where it came from
    (runner/step_time/device_figures.py; None: unknown)."""

    cluster: str
    memory_bytes: float | None
    memory_source: str
    headroom: float
    usable_bytes: float
    gpus_per_node: float | None  # a count, held as the device's other figures are
    gpus_per_node_source: str
    peak_flops: float | None
    peak_source: str
    intra_node_bytes_per_s: float | None
    inter_node_bytes_per_s: float | None
    bandwidth_source: str


@dataclass(frozen=True)
class PlannedMemory:
    """Device memory per rank, by term (runner/memory_model/peak.py MemoryTerms)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    residuals: dict[str, float]  # DeepSpeed's buffers beyond the textbook, by name
    grads_after_peak: float
    total: float
    build: float
    step: float
    peak: float


@dataclass(frozen=True)
class PlannedTraffic:
    """One parallel group's bytes per step per device and the link they cross."""

    bytes: float
    link: str
    seconds: float | None
    detail: str


@dataclass(frozen=True)
class PlannedTime:
    """The step, predicted from named terms and bounded by the roofline (runner/step_time/estimate.py)."""

    compute_s: float | None
    bubble_s: float | None
    comm_exposed_s: float | None
    step_s: float | None
    step_s_is_lower_bound: bool
    mfu: float | None
    tokens_per_s: float | None
    terms_s: dict[str, float]
    # the step's passes over gradients and weights (runner/step_time/optimizer_step_passes.py), by term
    term_parts_s: dict[str, dict[str, float]]
    # calibration figures fitted to measured steps, not micro-benchmarked, by term
    terms_fitted: dict[str, list[str]]
    limit: str | None
    bound_step_s: float | None
    bound_mfu: float | None
    calibration: str | None
    not_modelled: list[str]
    eval_s: float | None
    eval_share: float | None


@dataclass(frozen=True)
class PlanRecord:
    """plan.json, typed: every key it holds, in the order the file holds them."""

    layout: dict[str, int]  # runner/layout.py Layout.to_json
    batch_contract_error: str | None
    requested_global_size: int
    plan_only: list[str]  # why the layout can be planned but not launched here
    model: PlannedModel
    precision: str
    optimizer: str
    seq_len: int
    knobs: PlannedKnobs
    device: PlannedDevice
    memory_bytes: PlannedMemory
    host_memory_bytes_per_rank: dict[str, float]
    fits: bool  # the device; the host's verdict is host_memory's ``fits``
    margin_bytes: float
    host_memory: Record  # runner/plan/host.py HostMemory.to_json
    micro_size_choice: str | None
    comm_bytes_per_step: dict[str, PlannedTraffic]  # by parallel group: dp, tp, pp
    time: PlannedTime
    checkpoint_bytes: int | None
    checkpoint_s: float | None
    checkpoint_share: float | None
    # What plan=true adds (launchers/plan_job.py); None: not planned.
    checkpoint_disk: Record | None = None  # runner/checkpoint/size.py DiskNeed.to_json
    resume: Record | None = None  # runner/plan/planner.py ResumePlan.record_json
    max_seq: dict[str, int | None] | None = None  # planner.max_seq: the longest sequence by recompute mode
    recommendation: Record | None = None  # runner/plan/ladder.py recommendation_record
    exit_code: int | None = None  # the plan's verdict (launchers/plan_job.py plan_exit_code)
    schema: int = PLAN_SCHEMA_VERSION
    # Keys this ladder does not know (a plan of another version's), kept as read, read by nothing.
    unknown: Record = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: ``schema``, then the recorded keys in field order, a key plan=true did
        not add absent."""
        added = {f.name for f in fields(self) if f.default is None}
        values = dataclasses.asdict(self)
        unknown = values.pop("unknown")
        known = {name: value for name, value in values.items() if not (name in added and value is None)}
        return {"schema": known.pop("schema"), **known, **unknown}


class PlanFileError(ValueError):
    """A plan.json that is not JSON or holds a key of the wrong type."""


def _fix(path: Path) -> str:
    return f"move {path} aside (the run's other files stay readable) or plan the cell again"


def _parse(cls: Any, data: Any, path: Path, where: str) -> Any:
    """``data`` as the record ``cls``; PlanFileError names the key (``where``) when it is not one."""
    if not isinstance(data, dict):
        raise PlanFileError(f"{path}: key {where!r} is {data!r}, expected a JSON object; {_fix(path)}")
    hints = get_type_hints(cls)
    values = {}
    for f in fields(cls):
        if f.name == "unknown":
            continue
        key = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING:
                raise PlanFileError(f"{path}: key {key!r} is missing; {_fix(path)}")
            continue
        values[f.name] = _value(hints[f.name], data[f.name], path, key)
    if any(f.name == "unknown" for f in fields(cls)):
        values["unknown"] = {k: v for k, v in data.items() if k not in hints}
    return cls(**values)


def _value(hint: Any, value: Any, path: Path, key: str) -> Any:
    """One field's JSON value as its hint types it."""
    if dataclasses.is_dataclass(hint):
        return _parse(hint, value, path, key)
    if get_origin(hint) is dict and dataclasses.is_dataclass(item := get_args(hint)[1]):
        if not isinstance(value, dict):
            raise PlanFileError(f"{path}: key {key!r} is {value!r}, expected a JSON object; {_fix(path)}")
        return {name: _parse(item, each, path, f"{key}.{name}") for name, each in value.items()}
    if not holds(value, hint):
        raise PlanFileError(f"{path}: key {key!r} is {value!r}, expected {type_words(hint)}; {_fix(path)}")
    return value


def parse_plan(data: Any, path: Path) -> PlanRecord:
    """``data`` (plan.json's JSON) as a PlanRecord; PlanFileError names the file, the key and the fix."""
    if isinstance(data, dict) and "schema" not in data:
        data = {**data, "schema": PLAN_SCHEMA_VERSION}  # version 0: the same keys
    record: PlanRecord = _parse(PlanRecord, data, path, "")
    if record.schema > PLAN_SCHEMA_VERSION:
        raise PlanFileError(
            f"{path}: key 'schema' is {record.schema}, newer than this ladder reads ({PLAN_SCHEMA_VERSION}); "
            "upgrade ladder to read it"
        )
    return record


def load_plan(run_dir: Path) -> PlanRecord | None:
    """A run directory's plan.json through the schema (None when there is none); PlanFileError when
    it is not JSON or holds a wrongly typed key."""
    path = run_dir / PLAN_FILE
    try:
        data = read_json(path, PlanFileError, _fix(path))
    except FileNotFoundError:
        return None
    return parse_plan(data, path)


def write_plan(run_dir: Path, record: PlanRecord) -> Path:
    """Write plan.json into the run directory (atomically) and return its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / PLAN_FILE
    write_json_atomic(path, record.to_dict())
    return path


__all__ = [
    "PLAN_SCHEMA_VERSION",
    "PlanFileError",
    "PlanRecord",
    "PlannedDevice",
    "PlannedKnobs",
    "PlannedMemory",
    "PlannedModel",
    "PlannedTime",
    "PlannedTraffic",
    "load_plan",
    "parse_plan",
    "write_plan",
]
