"""Plan before you spend: memory, communication and step time of a layout, without launching a rank.

:func:`plan_layout` plans one layout and :func:`plan_config` a run's configured one;
``plan=true`` (launchers/plan_job.py ``plan_job``) prints it as a table (runner/report/plan_table.py),
walks the ladder (runner/plan/ladder.py) and writes ``plan.json``: those build on this
module, which imports neither. Nothing is allocated: the parameter count is analytic
(runner.model.shape.num_params) and every term is arithmetic (runner/memory_model/peak.py,
runner/step_time/estimate.py) on the device figures of runner/step_time/device_figures.py; a node's host
memory, steady and while the model is built, is runner/plan/host.py's.

The layout itself (the batch contract, ``batch.micro_size=auto``) is runner/plan/layout_choice.py's
``choose_layout``, which a run's launcher calls too (:func:`layout_for_config`): a plan shows the
layout its run would take. The host check does not choose the micro-batch and refuses no run,
as the device check refuses none with a fixed micro-batch: ``plan=true`` gives its verdict
(the ladder counts it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from runner.checkpoint.size import DiskNeed, checkpoint_bytes
from runner.config import (
    Objective,
    Offload,
    OffloadPlacement,
    TrainConfig,
)
from runner.errors import ConfigError
from runner.hardware.host_allocator import rank_allocator
from runner.layout import Layout, parse_micro_size, resolve_layout
from runner.memory_model.case import offload_placement, spec_of
from runner.memory_model.peak import MemoryTerms
from runner.model.shape import num_params as count_params
from runner.plan.host import HostMemory, host_memory
from runner.plan.layout_choice import LayoutChoice, choose_layout
from runner.plan.micro_fit import memory_at
from runner.rules import (
    config_layout_problems,
    layout_problems,
    offload_pair_problems,
    offload_switches,
    pipeline_engine_problems,
)
from runner.rundir.checkpoint_record import CheckpointRecord
from runner.rundir.plan_record import (
    PlannedDevice,
    PlannedKnobs,
    PlannedMemory,
    PlannedModel,
    PlannedTime,
    PlannedTraffic,
    PlanRecord,
)
from runner.step_time.device_figures import resolve_device
from runner.step_time.estimate import StepTime, Traffic, eval_time, step_time, traffic
from runner.step_time.workload import Knobs, Workload


@dataclass(frozen=True)
class Plan:
    """One planned layout: its terms, whether it fits, its traffic and its predicted step."""

    workload: Workload
    knobs: Knobs
    layout: Layout
    memory: MemoryTerms
    fits: bool
    micro_choice: str
    traffic: list[Traffic]
    time: StepTime
    plan_only: list[str]  # why the runner cannot run it yet (empty: it can)
    host: HostMemory  # a node's host memory (runner/plan/host.py)
    contract_error: str | None = None  # the configured global batch could not be split
    eval_s: float | None = None  # one held-out evaluation, predicted (train.eval_every; plan_time.eval_time)

    def _share_of_steps(self, seconds: float | None, every: int) -> float | None:
        """``seconds`` spent once every ``every`` steps, over those steps' time (None: unknown)."""
        step_s = self.time.step_s
        if seconds is None or not step_s or every <= 0:
            return None
        return seconds / (every * step_s)

    @property
    def eval_share(self) -> float | None:
        """The evaluations' time over the steps' (one evaluation every eval_every steps)."""
        return self._share_of_steps(self.eval_s, self.workload.eval_every)

    @property
    def checkpoint_bytes(self) -> int:
        """One checkpoint on disk, every rank's files (runner/checkpoint/size.py)."""
        w, k = self.workload, self.knobs
        return checkpoint_bytes(
            w.model,
            precision=w.precision,
            optimizer=w.optimizer,
            zero_stage=k.spec.zero_stage,
            tp=k.spec.tp,
            pp=k.spec.pp,
        )

    @property
    def checkpoint_s(self) -> float | None:
        """One save's time at the cluster's storage write speed (None: unknown)."""
        speed = self.workload.storage_bytes_per_s
        return None if not speed else self.checkpoint_bytes / speed

    @property
    def checkpoint_share(self) -> float | None:
        """The saves' time over the steps' (one save every train.checkpoint_every steps)."""
        return self._share_of_steps(self.checkpoint_s, self.workload.checkpoint_every)

    @property
    def runnable(self) -> bool:
        """Fits the device and the host, holds the configured global batch, and the runner can run it."""
        return self.fits and self.host.fits and not self.plan_only and self.contract_error is None

    def record(self) -> PlanRecord:
        """The record written to plan.json (bytes, seconds, FLOP/s)."""
        w, k, m = self.workload, self.knobs, self.memory
        return PlanRecord(
            layout=self.layout.to_json(),
            batch_contract_error=self.contract_error,
            requested_global_size=w.global_size,
            plan_only=list(self.plan_only),
            model=PlannedModel(name=w.model.name, num_params=w.num_params),
            precision=w.precision.value,
            optimizer=w.optimizer.value,
            seq_len=w.seq_len,
            knobs=PlannedKnobs(
                parallel=k.parallel,
                zero_stage=int(k.spec.zero_stage),
                recompute=k.spec.recompute.value,
                offload=k.spec.offload.value,
                overlap_comm=k.spec.overlap_comm,
                micro_size="auto" if k.micro_size is None else k.micro_size,
            ),
            device=_planned_device(w),
            memory_bytes=PlannedMemory(
                params=m.params,
                grads=m.grads,
                optimizer=m.optimizer,
                activations=m.activations,
                residuals=dict(m.residuals),
                grads_after_peak=m.grads_after_peak,
                total=m.total,
                build=m.build,
                step=m.step,
                peak=m.peak,
            ),
            host_memory_bytes_per_rank=dict(m.host),
            fits=self.fits,
            margin_bytes=w.usable_bytes - m.peak,
            host_memory=self.host.to_json(),
            micro_size_choice=self.micro_choice,
            comm_bytes_per_step={
                t.group: PlannedTraffic(bytes=t.bytes, link=t.link, seconds=t.seconds, detail=t.detail)
                for t in self.traffic
            },
            time=self._planned_time(),
            checkpoint_bytes=self.checkpoint_bytes,
            checkpoint_s=self.checkpoint_s,
            checkpoint_share=self.checkpoint_share,
        )

    def _planned_time(self) -> PlannedTime:
        """plan.json's ``time``: the step's terms, its bound and where its figures came from."""
        t = self.time
        return PlannedTime(
            compute_s=t.compute_s,
            bubble_s=t.bubble_s,
            comm_exposed_s=t.comm_s,
            step_s=t.step_s,
            step_s_is_lower_bound=not t.complete,
            mfu=t.mfu,
            tokens_per_s=t.tokens_per_s,
            terms_s={term.name: term.seconds for term in t.terms},
            term_parts_s={
                term.name: {part.name: part.seconds for part in term.parts} for term in t.terms if term.parts
            },
            terms_fitted={term.name: list(term.fitted) for term in t.terms if term.fitted},
            limit=t.limit,
            bound_step_s=t.bound_step_s,
            bound_mfu=t.bound_mfu,
            calibration=t.calibration or None,
            not_modelled=["offload transfers and CPU optimizer step"]
            if self.knobs.spec.offload != OffloadPlacement.none
            else [],
            eval_s=self.eval_s,
            eval_share=self.eval_share,
        )


def _planned_device(w: Workload) -> PlannedDevice:
    """plan.json's ``device``: each figure the plan assumed, with where it came from."""
    dev = w.device
    return PlannedDevice(
        cluster=w.cluster,
        memory_bytes=dev.memory_bytes.value,
        memory_source=dev.memory_bytes.source,
        headroom=w.headroom,
        usable_bytes=w.usable_bytes,
        gpus_per_node=dev.gpus_per_node.value,
        gpus_per_node_source=dev.gpus_per_node.source,
        peak_flops=dev.peak_flops.value,
        peak_source=dev.peak_flops.source,
        intra_node_bytes_per_s=dev.intra_node_bytes_per_s.value,
        inter_node_bytes_per_s=dev.inter_node_bytes_per_s.value,
        bandwidth_source=dev.inter_node_bytes_per_s.source,
    )


# --------------------------------------------------------------------------------------
# From the typed config
# --------------------------------------------------------------------------------------


def offload_mode(offload_optimizer: Offload, offload_param: Offload) -> OffloadPlacement:
    """The config's two offload enums as runner.memory.model_states' offload placement
    (runner.memory_model.case.offload_placement), refusing a pair no placement makes (ConfigError)."""
    _refuse(offload_pair_problems(offload_optimizer, offload_param))
    return offload_placement(offload_optimizer, offload_param)


def knobs_from_config(config: TrainConfig) -> Knobs:
    """The layout knobs a run's config sets."""
    # Asked of the config itself, as validate asks it: Knobs' placement cannot hold parameters
    # offloaded without the optimizer states, nor Knobs the cluster's node size.
    _refuse(config_layout_problems(config))
    return Knobs(
        parallel=config.parallel.name,
        spec=spec_of(config.parallel, config.model.activation_checkpointing),
        micro_size=parse_micro_size(config.batch.micro_size),
    )


def workload_from_config(config: TrainConfig, *, with_peak: bool = True) -> Workload:
    """The fixed part of a plan, with the device resolved (``with_peak=False``: memory only)."""
    return Workload(
        model=config.model,
        num_params=count_params(config.model),
        precision=config.precision.name,
        optimizer=config.optimizer.name,
        seq_len=config.data.seq_len,
        global_size=config.batch.global_size,
        gpus=config.gpus,
        headroom=config.planner.headroom,
        device=resolve_device(
            config.cluster,
            config.precision.name,
            gpus=config.gpus,
            with_peak=with_peak,
            measure_gpu=config.planning,  # a run's launcher measures no GPU
        ),
        cluster=config.cluster.name,
        compiled=config.train.compile,
        # the local launcher's CPU ranks (runner/hardware/host_allocator.py); a GPU's calibration has
        # no page-fault figure, so the flag changes nothing there
        keeps_freed_memory=rank_allocator(
            config.train.host_allocator, cpu_rank=True, environ=os.environ
        ).keeps_freed_memory,
        eval_every=config.train.eval_every,
        eval_batches=config.train.eval_batches,
        checkpoint_every=config.train.checkpoint_every,
        storage_bytes_per_s=None
        if config.cluster.storage_gb_per_s is None
        else config.cluster.storage_gb_per_s * 1e9,
    )


# --------------------------------------------------------------------------------------
# Memory of one micro-batch size, and the auto choice
# --------------------------------------------------------------------------------------


def _refuse(problems: list[str]) -> None:
    """Raise ConfigError listing ``problems``, in runner/preflight/validate.py's form; nothing if none."""
    if problems:
        raise ConfigError("\n".join(f"  - {p}" for p in problems))


def check_knobs(workload: Workload, knobs: Knobs) -> None:
    """Refuse knobs no plan can size, in the words a run is refused with (runner.rules.layout_problems)."""
    _refuse(layout_problems(workload.model, knobs.spec, seq_len=workload.seq_len))


# --------------------------------------------------------------------------------------
# One layout
# --------------------------------------------------------------------------------------


def plan_only_reasons(knobs: Knobs) -> list[str]:
    """Why the runner cannot run these knobs yet (empty when it can): the refusals of a run's launch
    that a plan sizes all the same (runner.rules.pipeline_engine_problems)."""
    offload_optimizer, offload_param = offload_switches(knobs.spec.offload)
    return pipeline_engine_problems(
        pp=knobs.spec.pp,
        zero_stage=knobs.spec.zero_stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
    )


def plan_layout(workload: Workload, knobs: Knobs, *, objective: Objective = Objective.memory) -> Plan:
    """Plan one layout: the layout its run would take (runner/plan/layout_choice.py ``choose_layout``:
    auto micro by ``objective``), then memory, traffic, time.

    A global batch that dp does not divide is not refused here: the plan is made at the
    smallest multiple of dp above it and says so (``contract_error``), so that a sweep
    answers every cell.
    """
    check_knobs(workload, knobs)
    choice = choose_layout(workload, knobs, objective=objective, refuse=False)
    layout = choice.layout
    memory = memory_at(
        workload, knobs, micro_size=layout.micro_size, dp=layout.dp, accum_steps=layout.accum_steps
    )
    groups = traffic(workload, knobs, layout)
    time = step_time(workload, knobs, layout, groups)
    evaluation = eval_time(workload, knobs, layout, time) if workload.eval_every > 0 else None
    return Plan(
        workload=workload,
        knobs=knobs,
        layout=layout,
        memory=memory,
        fits=memory.peak <= workload.usable_bytes,
        micro_choice=choice.reason or "",
        traffic=groups,
        time=time,
        plan_only=plan_only_reasons(knobs),
        host=host_memory(workload, knobs, layout, memory),
        contract_error=choice.contract_error,
        eval_s=evaluation,
    )


# --------------------------------------------------------------------------------------
# A run's configured layout (launchers/plan_job.py prints it and writes plan.json)
# --------------------------------------------------------------------------------------


def plan_config(config: TrainConfig) -> Plan:
    """The plan of a run's configured layout (what ``plan=true`` prints)."""
    return plan_layout(
        workload_from_config(config), knobs_from_config(config), objective=config.planner.objective
    )


def plan_chosen(config: TrainConfig, layout: Layout) -> Plan:
    """The plan of a run's layout as it was chosen (``layout``: the auto micro-batch fixed): what the
    launcher weighs before the ranks start, and the step it predicts (summary.json ``step_time``);
    with ``planner.objective=memory``, memory only (no peak measured)."""
    knobs = knobs_from_config(config)
    if knobs.micro_size is None:
        knobs = replace(knobs, micro_size=layout.micro_size)
    speed = config.planner.objective == Objective.speed  # the peak is read already: the step is predicted
    return plan_layout(workload_from_config(config, with_peak=speed), knobs)


def layout_for_config(config: TrainConfig) -> LayoutChoice:
    """A run's layout as its launcher takes it before any rank starts: runner/plan/layout_choice.py
    ``choose_layout``, refusing (LayoutError) what it cannot split or fit. A configured micro-batch
    is the batch contract alone: no device is resolved and no memory weighed (``reason`` None)."""
    micro_size = parse_micro_size(config.batch.micro_size)
    if micro_size is not None:
        par = config.parallel
        layout = resolve_layout(
            gpus=config.gpus,
            tp=par.tp,
            pp=par.pp,
            sp=par.sp,
            global_size=config.batch.global_size,
            micro_size=micro_size,
        )
        return LayoutChoice(layout, reason=None)
    objective = config.planner.objective  # speed: the device's peak and calibration predict the steps
    workload = workload_from_config(config, with_peak=objective == Objective.speed)
    knobs = knobs_from_config(config)
    check_knobs(workload, knobs)
    return choose_layout(workload, knobs, objective=objective)


@dataclass(frozen=True)
class ResumePlan:
    """What ``train.resume=auto`` finds in the run directory, weighed as the run weighs it before
    its ranks start (launchers/run.py ``resume_plan``)."""

    disk: DiskNeed  # the run's checkpoints, beside those there and a move's converted copy
    record: CheckpointRecord | None = None  # the checkpoint it continues; None: it starts at step 0
    saved_bytes: int = 0  # that checkpoint's files, which a conversion reads
    refusal: str | None = None  # why the run would not continue it on this layout

    def conversion_s(self, storage_bytes_per_s: float | None) -> float | None:
        """A move's conversion at the storage's speed: reading the checkpoint, writing the copies
        (a lower bound: the conversion's own compute is not counted); None: no move, or unknown."""
        conversion = self.disk.conversion
        if conversion is None or not storage_bytes_per_s:
            return None
        return (self.saved_bytes + conversion.stays) / storage_bytes_per_s

    def record_json(self, storage_bytes_per_s: float | None) -> dict[str, Any]:
        """plan.json's ``resume``."""
        if self.record is None:
            return {"from": None}
        return {
            "from": self.record["tag"],
            "completed_steps": self.record["completed_steps"],
            "saved_bytes": self.saved_bytes,
            "refused": self.refusal,
            "conversion_s_at_least": self.conversion_s(storage_bytes_per_s),
        }


__all__ = [
    "Knobs",
    "Plan",
    "ResumePlan",
    "Workload",
    "check_knobs",
    "knobs_from_config",
    "layout_for_config",
    "offload_mode",
    "plan_chosen",
    "plan_config",
    "plan_layout",
    "workload_from_config",
]
