"""The ladder: when a model does not fit, try the remedies cheapest first and stop at the first that fits.

``planner.recommend=true``. For the run's model, precision, optimizer, gpus, global batch
and device, the rungs in order (DESIGN.md, "the cheap-to-costly order"):

1. DDP with the whole per-rank batch in one micro-batch (accum 1);
2. a smaller micro-batch with gradient accumulation;
3. activation checkpointing, selective (attention core only) then full (Korthikanti et
   al. 2022, arXiv 2205.05198, Sec. 5);
4. ZeRO stages 1, 2, 3 (Rajbhandari et al. 2019, arXiv 1910.02054);
5. ZeRO-3 with the optimizer, then also the parameters, offloaded to the CPU (ZeRO-Offload,
   Ren et al. 2021, arXiv 2101.06840);
6. tensor parallel inside a node: tp = 2, 4, ... up to gpus_per_node, powers of 2 dividing
   the head counts and the MLP width (Shoeybi et al. 2019, arXiv 1909.08053);
7. pipeline parallel across nodes, with tp at its largest: pp = 2, 4, ... (Narayanan et
   al. 2021, arXiv 2104.04473, Sec. 3.3: tensor parallel up to the node size, pipeline
   beyond it), with ZeRO 0 or 1 only (DeepSpeed's pipeline engine refuses ZeRO-2/3).

Within rungs 4-7 the cheaper knobs are tried again in the same order (no recompute, then
selective, then full; then a higher ZeRO stage; then offload), so a winner never
recomputes, shards or offloads more than it needs. Every candidate takes the largest
micro-batch that fits (auto). A candidate fits when its bytes fit the device and its node's
host memory fits the host RAM (runner/plan/host.py: what every rank builds there, the whole
model under tensor parallelism, offloaded states times the ranks per node). A rung
that fails reports its closest candidate: its bytes against the usable memory and its
largest term, or its host bytes per node. Layouts the runner cannot run yet
(runner/plan/planner.py ``plan_only_reasons``) are planned all the same and marked "plan only".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.config import OffloadPlacement, Recompute, ZeroStage
from runner.plan.planner import Knobs, Plan, Workload, gb, plan_layout

# Each stage is tried as the conf/parallel option of its name (ddp, zero1, zero2, zero3).
_STAGES = tuple(ZeroStage)
_RECOMPUTES = (Recompute.none, Recompute.selective, Recompute.full)  # cheapest first
_OFFLOADS = (OffloadPlacement.optimizer, OffloadPlacement.optimizer_and_params)  # least moved first


@dataclass(frozen=True)
class Rung:
    """One rung tried: its name, the plan that decided it, and the verdict in words."""

    name: str
    plan: Plan  # the first candidate that fits, else the closest one
    fits: bool
    reason: str


@dataclass(frozen=True)
class Ladder:
    """The rungs tried in order, the winner (None: nothing fits) and how to run it."""

    workload: Workload
    rungs: list[Rung]
    winner: Rung | None
    overrides: list[str]

    @property
    def command(self) -> str:
        """The command line that runs (or, for plan-only layouts, plans) the winner."""
        return "python train.py " + " ".join(self.overrides) if self.overrides else ""


def tp_degrees(workload: Workload) -> list[int]:
    """Tensor-parallel degrees to try: powers of 2 up to gpus_per_node dividing heads, kv heads, MLP width."""
    model = workload.model
    n_kv = model.n_kv_head or model.n_head
    degrees, t = [], 2
    while t <= min(workload.device.per_node, workload.gpus):
        if not (model.n_head % t or n_kv % t or model.ffn_hidden % t or workload.gpus % t):
            degrees.append(t)
        t *= 2
    return degrees


def pp_degrees(workload: Workload, tp: int) -> list[int]:
    """Pipeline degrees across nodes: powers of 2 with tp x pp dividing gpus and pp <= n_layer."""
    if workload.gpus <= workload.device.per_node:
        return []
    degrees, p = [], 2
    while tp * p <= workload.gpus and p <= workload.model.n_layer:
        if workload.gpus % (tp * p) == 0:
            degrees.append(p)
        p *= 2
    return degrees


def rungs(workload: Workload, *, overlap_comm: bool = False) -> list[tuple[str, list[Knobs]]]:
    """The rungs in cheap-to-costly order, each with its candidate knobs (see the module docstring)."""

    def k(stage: ZeroStage, **more: Any) -> Knobs:
        return Knobs(parallel=stage.name, zero_stage=stage, overlap_comm=overlap_comm, **more)

    ddp, zero1, zero3 = ZeroStage.ddp, ZeroStage.zero1, ZeroStage.zero3
    whole = workload.global_size // workload.gpus
    ladder: list[tuple[str, list[Knobs]]] = [
        (f"ddp, micro {whole or 'global/dp'} (accum 1)", [k(ddp, micro_size=whole or None)]),
        ("ddp, smaller micro + accumulation", [k(ddp)]),
        ("ddp + selective recompute", [k(ddp, recompute=Recompute.selective)]),
        ("ddp + full recompute", [k(ddp, recompute=Recompute.full)]),
    ]
    for stage in _STAGES[1:]:
        ladder.append((stage.name, [k(stage, recompute=r) for r in _RECOMPUTES]))
    for offload in _OFFLOADS:
        ladder.append(
            (
                f"zero3 + offload {offload.value}",
                [k(zero3, recompute=r, offload=offload) for r in _RECOMPUTES],
            )
        )
    tps = tp_degrees(workload)
    for t in tps:
        candidates = [k(s, tp=t, recompute=r) for s in _STAGES for r in _RECOMPUTES]
        candidates += [k(zero3, tp=t, recompute=r, offload=o) for o in _OFFLOADS for r in _RECOMPUTES]
        ladder.append((f"tp {t} inside a node", candidates))
    t_max = tps[-1] if tps else 1
    for p in pp_degrees(workload, t_max):
        # DeepSpeed's pipeline engine takes ZeRO 0 or 1 only (deepspeed/runtime/pipe/engine.py).
        candidates = [k(s, tp=t_max, pp=p, recompute=r) for s in _STAGES[:2] for r in _RECOMPUTES]
        candidates += [
            k(zero1, tp=t_max, pp=p, recompute=r, offload=OffloadPlacement.optimizer) for r in _RECOMPUTES
        ]
        ladder.append((f"pp {p} across nodes, tp {t_max}", candidates))
    return ladder


def _usable(workload: Workload) -> str:
    return f"{gb(workload.usable_bytes)} usable"


def _verdict(plan: Plan) -> str:
    """One line: the layout, its micro/accum, its bytes against the usable memory, its step."""
    w, m, lay = plan.workload, plan.memory, plan.layout
    head = f"{plan.knobs.describe()}, micro {lay.micro_size} x accum {lay.accum_steps}"
    if plan.contract_error is not None:
        return f"{head}: batch contract: {plan.contract_error.split(';')[0]}"
    if not plan.fits:
        name, size = m.largest()
        return f"{head}: {gb(m.peak)} > {_usable(w)} ({name} {gb(size)})"
    h = plan.host
    if not h.fits:
        phase = "to build" if h.phase == "build" else "steady"
        return (
            f"{head}: {gb(m.peak)} of {_usable(w)}, but the host: {gb(h.peak_per_node)} per node {phase} "
            f"({h.ranks_per_node} x {gb(h.peak_per_rank)}) > {gb(h.usable_bytes)} usable host RAM"
        )
    text = f"{head}: {gb(m.peak)} of {_usable(w)}"
    t = plan.time
    if t.step_s is not None and t.mfu is not None:
        bound = "" if t.complete else " (comm unknown: bound)"
        text += f"; step {t.step_s:.3g} s, MFU {100 * t.mfu:.1f}%{bound}"
    if plan.plan_only:
        text += " [plan only]"
    return text


def _decide(name: str, candidates: list[Knobs], workload: Workload) -> Rung:
    """The first candidate that fits device and host (and holds the global batch), else the closest one."""
    plans = []
    for knobs in candidates:
        plan = plan_layout(workload, knobs)
        if plan.fits and plan.host.fits and plan.contract_error is None:
            return Rung(name, plan, True, _verdict(plan))
        plans.append(plan)
    held = [p for p in plans if p.contract_error is None]
    closest = min(held, key=lambda p: p.memory.peak) if held else plans[0]
    return Rung(name, closest, False, _verdict(closest))


def overrides_for(plan: Plan) -> list[str]:
    """The command-line overrides that run (or plan) exactly this layout for this workload."""
    w, k = plan.workload, plan.knobs
    out = [
        f"model={w.model.name}",
        f"cluster={w.cluster}",
        f"gpus={w.gpus}",
        f"precision={w.precision.value}",
        f"optimizer={w.optimizer.value}",
        f"data.seq_len={w.seq_len}",
        f"batch.global_size={w.global_size}",
        f"parallel={k.parallel}",
    ]
    if k.tp > 1:
        out.append(f"parallel.tp={k.tp}")
    if k.pp > 1:
        out.append(f"parallel.pp={k.pp}")
    if k.offload != OffloadPlacement.none:
        out.append("parallel.offload_optimizer=cpu")
    if k.offload == OffloadPlacement.optimizer_and_params:
        out.append("parallel.offload_param=cpu")
    if k.recompute != Recompute.none:
        out.append(f"model.activation_checkpointing={k.recompute.value}")
    out.append(f"batch.micro_size={plan.layout.micro_size}")
    if plan.plan_only:
        out.append("plan=true")
    return out


def recommend(workload: Workload, *, overlap_comm: bool = False) -> Ladder:
    """Walk the rungs cheapest first; stop at the first layout that fits."""
    tried: list[Rung] = []
    for name, candidates in rungs(workload, overlap_comm=overlap_comm):
        rung = _decide(name, candidates, workload)
        tried.append(rung)
        if rung.fits:
            return Ladder(workload, tried, rung, overrides_for(rung.plan))
    return Ladder(workload, tried, None, [])


def recommendation_record(ladder: Ladder) -> dict[str, Any]:
    """The ladder as JSON for plan.json: each rung's verdict, the winner's plan and overrides."""
    return {
        "rungs": [
            {
                "rung": r.name,
                "fits": r.fits,
                "reason": r.reason,
                "layout": r.plan.layout.record(),
                "knobs": r.plan.record()["knobs"],
                "total_bytes": r.plan.memory.total,
                "plan_only": r.plan.plan_only,
            }
            for r in ladder.rungs
        ],
        "winner": None if ladder.winner is None else ladder.winner.plan.record(),
        "overrides": ladder.overrides,
        "command": ladder.command,
    }


__all__ = [
    "Ladder",
    "Rung",
    "overrides_for",
    "pp_degrees",
    "recommend",
    "recommendation_record",
    "rungs",
    "tp_degrees",
]
