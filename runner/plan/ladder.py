"""The ladder: plan every remedy, cheapest first, and rank the layouts that fit by predicted speed.

``planner.recommend=true``. For the run's model, precision, optimizer, gpus, global batch
and device, the rungs in order (DESIGN.md, "the cheap-to-costly order"):

1. DDP with the whole per-rank batch in one micro-batch (accum 1);
2. a smaller micro-batch with gradient accumulation;
3. activation checkpointing, selective (attention core only) then full (Korthikanti et
   al. 2022, arXiv 2205.05198, Sec. 5);
4. ZeRO stages 1, 2, 3 (Rajbhandari et al. 2019, arXiv 1910.02054);
5. ZeRO-3 with the optimizer, then also the parameters, offloaded to the CPU (ZeRO-Offload,
   Ren et al. 2021, arXiv 2101.06840);
6. sequence parallel inside a node: sp = 2, 4, ... up to gpus_per_node, powers of 2 dividing
   the head counts and the sequence, beside every ZeRO stage (DeepSpeed-Ulysses, Jacobs et al.
   2023, arXiv 2309.14509): each rank holds seq/sp of every sample's activations;
7. tensor parallel inside a node: tp = 2, 4, ... up to gpus_per_node, powers of 2 dividing
   the head counts and the MLP width (Shoeybi et al. 2019, arXiv 1909.08053);
8. pipeline parallel across nodes, with tp at its largest: pp = 2, 4, ... (Narayanan et
   al. 2021, arXiv 2104.04473, Sec. 3.3: tensor parallel up to the node size, pipeline
   beyond it), with ZeRO 0 or 1 only (DeepSpeed's pipeline engine refuses ZeRO-2/3).

Within rungs 4-8 the cheaper knobs come first in the same order (no recompute, then
selective, then full; then a higher ZeRO stage; then offload). Every candidate of every rung
is planned, at the largest micro-batch that fits and at each smaller divisor of global/dp
(its accumulation grows). A candidate fits when its bytes fit the device, its node's host
memory fits the host RAM (runner/plan/host.py: what every rank builds there, the whole model
under tensor parallelism, offloaded states times the ranks per node) and it holds the global batch.

**The ranking.** Those that fit are ranked by predicted tokens/s (``plan.time.tokens_per_s``:
runner/step_time/estimate.py, the calibrated model where the device has a calibration, else the
roofline bound). Offload's transfers and CPU optimizer step are not in that model, which would
make an offloaded layout look as fast as its stage without offload: offloaded candidates are
ranked only when nothing without offload fits. **The recommendation** is the cheapest
candidate within :data:`NEAR_FASTEST` (2%) of the fastest's predicted tokens/s: the earliest
rung, then the earliest candidate of its rung, then the largest micro-batch. A model that
cannot tell two layouts apart by more than that does not justify the costlier one; without
any prediction (no peak) that is the first layout that fits, cheapest first, as the ladder
always chose.

Each rung keeps its verdict, the explanation: its cheapest candidate that fits, else its
closest one: its bytes against the usable memory and its largest term, or its host bytes per
node. Layouts the runner cannot run yet (runner/plan/planner.py ``plan_only_reasons``) are
planned all the same and marked "plan only".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from runner.config import OffloadPlacement, ParallelSpec, Recompute, ZeroStage
from runner.layout import divisors
from runner.memory_model.units import gb
from runner.plan.command import model_overrides, workload_overrides
from runner.plan.planner import Knobs, Plan, Workload, plan_layout
from runner.rules import pipeline_depth_problems, sp_problems, tp_problems

# Each stage is tried as the conf/parallel option of its name (ddp, zero1, zero2, zero3).
_STAGES = tuple(ZeroStage)
_RECOMPUTES = (Recompute.none, Recompute.selective, Recompute.full)  # cheapest first
# A compiled block takes the attention-core mode in op-level selective's place (runner/rules/recompute.py).
_COMPILED_RECOMPUTES = (Recompute.none, Recompute.attention, Recompute.full)
_OFFLOADS = (OffloadPlacement.optimizer, OffloadPlacement.optimizer_and_params)  # least moved first
NEAR_FASTEST = 0.02  # a cheaper candidate this close to the fastest's tokens/s is recommended instead
SHOWN = 5  # ranked candidates printed


@dataclass(frozen=True)
class Rung:
    """One rung tried: its name, the plan that decided it, and the verdict in words."""

    name: str
    plan: Plan  # the first candidate that fits, else the closest one
    fits: bool
    reason: str
    fitting: int = 0  # its candidates (knobs x micro-batch) that fit


@dataclass(frozen=True)
class Candidate:
    """One layout that fits: the rung it came from (0: the cheapest), its place there, its plan."""

    rung: int
    name: str  # the rung's
    order: int  # its knobs' place in the rung, cheapest first
    plan: Plan

    @property
    def tokens_per_s(self) -> float:
        """Predicted tokens/s (0.0: not predicted)."""
        return self.plan.time.tokens_per_s or 0.0

    @property
    def cheapness(self) -> tuple[int, int, int]:
        """The ladder's order: earlier rung, earlier knobs, larger micro-batch."""
        return (self.rung, self.order, -self.plan.layout.micro_size)


@dataclass(frozen=True)
class Ladder:
    """Every rung in order, the candidates that fit ranked fastest first, the recommendation
    (None: nothing fits) and how to run it."""

    workload: Workload
    rungs: list[Rung]
    winner: Candidate | None
    overrides: list[str]
    ranking: list[Candidate]
    carried: tuple[str, ...] = ()  # the plan's own overrides the layout leaves as they were

    @property
    def command(self) -> str:
        """The command line that runs (or, for plan-only layouts, plans) the winner: its layout's
        overrides, then every other override the plan was given (:func:`carried_overrides`)."""
        return "python train.py " + " ".join([*self.overrides, *self.carried]) if self.overrides else ""


def tp_degrees(workload: Workload) -> list[int]:
    """Tensor-parallel degrees to try: powers of 2 up to gpus_per_node dividing gpus, that split the
    heads, kv heads and MLP width (runner.rules.tp_problems)."""
    degrees, t = [], 2
    while t <= min(workload.device.per_node, workload.gpus):
        if workload.gpus % t == 0 and not tp_problems(workload.model, tp=t):
            degrees.append(t)
        t *= 2
    return degrees


def sp_degrees(workload: Workload) -> list[int]:
    """Sequence-parallel degrees to try: powers of 2 up to gpus_per_node dividing gpus, that split
    the heads, kv heads and the sequence (runner.rules.sp_problems)."""
    degrees, s = [], 2
    while s <= min(workload.device.per_node, workload.gpus):
        if workload.gpus % s == 0 and not sp_problems(
            workload.model, sp=s, tp=1, pp=1, seq_len=workload.seq_len
        ):
            degrees.append(s)
        s *= 2
    return degrees


def pp_degrees(workload: Workload, tp: int) -> list[int]:
    """Pipeline degrees across nodes: powers of 2 with tp x pp dividing gpus and a block on every stage
    (runner.rules.pipeline_depth_problems)."""
    if workload.gpus <= workload.device.per_node:
        return []
    degrees, p = [], 2
    while tp * p <= workload.gpus and not pipeline_depth_problems(n_layer=workload.model.n_layer, pp=p):
        if workload.gpus % (tp * p) == 0:
            degrees.append(p)
        p *= 2
    return degrees


def rungs(workload: Workload, *, overlap_comm: bool | None = None) -> list[tuple[str, list[Knobs]]]:
    """The rungs in cheap-to-costly order, each with its candidate knobs (see the module docstring).
    ``overlap_comm``: the run's ``parallel.overlap_comm``; null, each stage's DeepSpeed default."""

    def k(stage: ZeroStage, *, micro_size: int | None = None, **spec: Any) -> Knobs:
        overlap = stage.overlaps_comm(overlap_comm)
        return Knobs(stage.name, ParallelSpec(zero_stage=stage, overlap_comm=overlap, **spec), micro_size)

    ddp, zero1, zero3 = ZeroStage.ddp, ZeroStage.zero1, ZeroStage.zero3
    whole = workload.global_size // workload.gpus
    recomputes: tuple[Recompute, ...] = _COMPILED_RECOMPUTES if workload.compiled else _RECOMPUTES
    partial = recomputes[1]
    ladder: list[tuple[str, list[Knobs]]] = [
        (f"ddp, micro {whole or 'global/dp'} (accum 1)", [k(ddp, micro_size=whole or None)]),
        ("ddp, smaller micro + accumulation", [k(ddp)]),
        (f"ddp + {partial.value} recompute", [k(ddp, recompute=partial)]),
        ("ddp + full recompute", [k(ddp, recompute=Recompute.full)]),
    ]
    if workload.model.offload_activations:
        # The offload moves full recompute's block inputs only (runner/rules/activation_offload.py).
        recomputes = (Recompute.full,)
        ladder = ladder[-1:]
    for stage in _STAGES[1:]:
        ladder.append((stage.name, [k(stage, recompute=r) for r in recomputes]))
    for offload in _OFFLOADS:
        ladder.append(
            (
                f"zero3 + offload {offload.value}",
                [k(zero3, recompute=r, offload=offload) for r in recomputes],
            )
        )
    for degree in sp_degrees(workload):
        candidates = [k(s, sp=degree, recompute=r) for s in _STAGES for r in recomputes]
        ladder.append((f"sp {degree} inside a node", candidates))
    tps = tp_degrees(workload)
    for t in tps:
        candidates = [k(s, tp=t, recompute=r) for s in _STAGES for r in recomputes]
        candidates += [k(zero3, tp=t, recompute=r, offload=o) for o in _OFFLOADS for r in recomputes]
        ladder.append((f"tp {t} inside a node", candidates))
    t_max = tps[-1] if tps else 1
    for p in pp_degrees(workload, t_max):
        # DeepSpeed's pipeline engine takes ZeRO 0 or 1 only (deepspeed/runtime/pipe/engine.py).
        candidates = [k(s, tp=t_max, pp=p, recompute=r) for s in _STAGES[:2] for r in recomputes]
        candidates += [
            k(zero1, tp=t_max, pp=p, recompute=r, offload=OffloadPlacement.optimizer) for r in recomputes
        ]
        ladder.append((f"pp {p} across nodes, tp {t_max}", candidates))
    return ladder


# An offloaded layout's transfers and CPU optimizer step are not in the step-time model: its
# verdict and ranked line carry this mark, not a step time (docs/memory-and-plan.md).
OFFLOAD_MARK = "offload: not modelled (its transfers and CPU optimizer step are not timed), no step time"


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
    if plan.knobs.spec.offload != OffloadPlacement.none:
        text += f"; {OFFLOAD_MARK}"
    elif t.step_s is not None and t.mfu is not None:
        bound = "" if t.complete else " (comm unknown: bound)"
        text += f"; step {t.step_s:.3g} s, MFU {100 * t.mfu:.1f}%{bound}"
    if plan.plan_only:
        text += " [plan only]"
    return text


def _smaller_micros(plan: Plan) -> list[int]:
    """The divisors of global/dp below an auto plan's micro-batch, largest first (they hold less)."""
    lay = plan.layout
    return [m for m in reversed(divisors(lay.global_size // lay.dp)) if m < lay.micro_size]


def _fits(plan: Plan) -> bool:
    return plan.fits and plan.host.fits and plan.contract_error is None


def _decide(
    index: int, name: str, candidates: list[Knobs], workload: Workload
) -> tuple[Rung, list[Candidate]]:
    """Plan every candidate of a rung at each micro-batch that fits; the rung's verdict (its first
    candidate that fits, else the closest one) and the candidates that fit."""
    plans, fitting = [], []
    for order, knobs in enumerate(candidates):
        plan = plan_layout(workload, knobs)  # auto: the largest micro-batch that fits
        plans.append(plan)
        if not _fits(plan):
            continue
        fitting.append(Candidate(index, name, order, plan))
        if knobs.micro_size is None:
            for micro in _smaller_micros(plan):
                smaller = plan_layout(workload, replace(knobs, micro_size=micro))
                if _fits(smaller):
                    fitting.append(Candidate(index, name, order, smaller))
    if fitting:
        first = fitting[0].plan
        return Rung(name, first, True, _verdict(first), len(fitting)), fitting
    held = [p for p in plans if p.contract_error is None]
    closest = min(held, key=lambda p: p.memory.peak) if held else plans[0]
    return Rung(name, closest, False, _verdict(closest)), []


def _key(candidate: Candidate) -> tuple[Any, ...]:
    """The same layout reached from two rungs (rung 1's micro = rung 2's auto under dp > 1) once."""
    k, lay = candidate.plan.knobs, candidate.plan.layout
    return (k.spec.zero_stage, k.spec.tp, k.spec.pp, k.spec.recompute, k.spec.offload, lay.micro_size)


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates fastest first by predicted tokens/s (ties: the cheaper first); offloaded ones
    only when nothing without offload fits (the model leaves offload's transfers out)."""
    seen: dict[tuple[Any, ...], Candidate] = {}
    for c in candidates:
        seen.setdefault(_key(c), c)
    unique = list(seen.values())
    kept = [c for c in unique if c.plan.knobs.spec.offload == OffloadPlacement.none] or unique
    return sorted(kept, key=lambda c: (-c.tokens_per_s, c.cheapness))


def best(ranking: list[Candidate]) -> Candidate | None:
    """The cheapest candidate within NEAR_FASTEST of the fastest's tokens/s (module docstring)."""
    if not ranking:
        return None
    floor = ranking[0].tokens_per_s * (1 - NEAR_FASTEST)
    return min((c for c in ranking if c.tokens_per_s >= floor), key=lambda c: c.cheapness)


def overrides_for(plan: Plan) -> list[str]:
    """The command-line overrides that run (or plan) exactly this layout for this workload."""
    w, k = plan.workload, plan.knobs
    out = [
        *model_overrides(w.model),
        f"cluster={w.cluster}",
        f"gpus={w.gpus}",
        f"precision={w.precision.value}",
        f"optimizer={w.optimizer.value}",
        f"data.seq_len={w.seq_len}",
        f"batch.global_size={w.global_size}",
        f"parallel={k.parallel}",
    ]
    if k.spec.tp > 1:
        out.append(f"parallel.tp={k.spec.tp}")
    if k.spec.pp > 1:
        out.append(f"parallel.pp={k.spec.pp}")
    if k.spec.sp > 1:
        out.append(f"parallel.sp={k.spec.sp}")
    if k.spec.offload != OffloadPlacement.none:
        out.append("parallel.offload_optimizer=cpu")
    if k.spec.offload == OffloadPlacement.optimizer_and_params:
        out.append("parallel.offload_param=cpu")
    if k.spec.recompute != Recompute.none:
        out.append(f"model.activation_checkpointing={k.spec.recompute.value}")
    out.append(f"batch.micro_size={plan.layout.micro_size}")
    out += workload_overrides(w)
    if plan.plan_only:
        out.append("plan=true")
    return out


# Keys the recommended layout decides (with those :func:`overrides_for` writes), and the plan's own
# switches: a plan's override of one of these is not carried into the recommended command.
_DECIDED = frozenset(
    {
        "plan",
        "parallel.zero_stage",
        "parallel.tp",
        "parallel.pp",
        "parallel.sp",
        "parallel.offload_optimizer",
        "parallel.offload_param",
        "model.activation_checkpointing",
        "batch.micro_size",
    }
)


def carried_overrides(given: list[str], layout: list[str]) -> tuple[str, ...]:
    """Of the overrides the plan was given (Hydra's task overrides), those the recommended command
    must carry to plan the same experiment: all but the layout's keys, planner.* and hydra.*."""
    decided = _DECIDED | {o.split("=", 1)[0] for o in layout}
    kept = []
    for override in given:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in decided or key.startswith(("planner.", "hydra.", "hydra/")):
            continue
        kept.append(override)
    return tuple(kept)


def recommend(
    workload: Workload, *, overlap_comm: bool | None = None, given: list[str] | None = None
) -> Ladder:
    """Plan every rung, rank what fits by predicted tokens/s, recommend by the module docstring's rule."""
    tried: list[Rung] = []
    fitting: list[Candidate] = []
    for index, (name, candidates) in enumerate(rungs(workload, overlap_comm=overlap_comm)):
        rung, fit = _decide(index, name, candidates, workload)
        tried.append(rung)
        fitting += fit
    ranking = rank(fitting)
    winner = best(ranking)
    overrides = [] if winner is None else overrides_for(winner.plan)
    return Ladder(workload, tried, winner, overrides, ranking, carried_overrides(given or [], overrides))


def _candidate_record(place: int, c: Candidate) -> dict[str, Any]:
    t = c.plan.time
    return {
        "rank": place,
        "rung": c.name,
        "knobs": asdict(c.plan.record().knobs),
        "layout": c.plan.layout.to_json(),
        "tokens_per_s": t.tokens_per_s,
        "step_s": t.step_s,
        "mfu": t.mfu,
        "limit": t.limit,
        "step_s_is_lower_bound": not t.complete,
        "peak_bytes": c.plan.memory.peak,
        "plan_only": c.plan.plan_only,
        "overrides": overrides_for(c.plan),
    }


def recommendation_record(ladder: Ladder) -> dict[str, Any]:
    """The ladder as JSON for plan.json: each rung's verdict, the ranking (every candidate that
    fits, fastest first), the winner's plan and overrides, and the rule that chose it."""
    winner = ladder.winner
    return {
        "rungs": [
            {
                "rung": r.name,
                "fits": r.fits,
                "fitting": r.fitting,
                "reason": r.reason,
                "layout": r.plan.layout.to_json(),
                "knobs": asdict(r.plan.record().knobs),
                "total_bytes": r.plan.memory.total,
                "plan_only": r.plan.plan_only,
            }
            for r in ladder.rungs
        ],
        "ranking": [_candidate_record(i, c) for i, c in enumerate(ladder.ranking, 1)],
        "rule": (
            f"ranked by predicted tokens/s; the recommendation is the cheapest (earliest rung, then "
            f"knobs, then largest micro) within {NEAR_FASTEST:.0%} of the fastest"
        ),
        "winner_rung": None if winner is None else winner.name,
        "winner_rank": None if winner is None else ladder.ranking.index(winner) + 1,
        "winner": None if winner is None else winner.plan.record().to_dict(),
        "overrides": ladder.overrides,
        "command": ladder.command,
    }


__all__ = [
    "NEAR_FASTEST",
    "OFFLOAD_MARK",
    "SHOWN",
    "Candidate",
    "Ladder",
    "Rung",
    "best",
    "carried_overrides",
    "overrides_for",
    "pp_degrees",
    "rank",
    "recommend",
    "recommendation_record",
    "rungs",
    "tp_degrees",
]
