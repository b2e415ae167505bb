"""``batch.micro_size=auto`` weighed by the plan's arithmetic: which sizes fit, and the fastest of them.

:class:`MicroFit` is the ``fits`` callable of runner.layout.resolve_layout. A micro-batch size
fits when its planned bytes per device (runner/memory_model/peak.py) are at most
``planner.headroom`` x the device memory. With ``planner.objective=speed`` (the default)
:meth:`MicroFit.choose` then takes, among the sizes that fit, the one the step-time model
(runner/step_time/estimate.py) predicts fastest, the largest of those within :data:`SPEED_TIE` of
it; with ``memory`` (or no prediction: no peak) the largest that fits. The configured recompute
(``model.activation_checkpointing``) is kept either way. runner/plan/layout_choice.py
``choose_layout`` is the one caller that decides a layout with it.
"""

from __future__ import annotations

from runner.config import Objective
from runner.layout import PIPELINE_MICRO_BATCHES_PER_STAGE, Layout, divisors, resolve_layout
from runner.memory_model.case import RankBatch, case_from_config
from runner.memory_model.peak import MemoryTerms, memory_terms
from runner.memory_model.units import gb
from runner.step_time.estimate import step_time, traffic
from runner.step_time.workload import Knobs, Workload

# planner.objective=speed: a micro-batch predicted within this fraction of the fastest step counts
# as fast as it, and the largest such wins (the memory choice). The margin is the model's own
# uncertainty between neighbouring sizes: on a 2-core CPU it put tiny's micro 4 7% ahead of
# micro 8, which measured 8% slower (docs/benchmarks-time-model.md); and a noisy calibration
# must not flip the choice between runs.
SPEED_TIE = 0.10


def memory_at(workload: Workload, knobs: Knobs, *, micro_size: int, dp: int, accum_steps: int) -> MemoryTerms:
    """Every memory term per device for these knobs at this micro-batch size."""
    return memory_terms(
        case_from_config(
            workload.model,
            knobs.spec,
            RankBatch(dp=dp, micro_size=micro_size, seq_len=workload.seq_len, accum_steps=accum_steps),
            precision=workload.precision,
            optimizer=workload.optimizer,
            compiled=workload.compiled,
            host_is_device=workload.device.is_host,
        )
    )


class MicroFit:
    """``fits(micro)`` for runner.layout.resolve_layout: planned bytes <= usable, remembering each try;
    then :meth:`choose` among those that fit by ``objective`` (see the module docstring)."""

    def __init__(
        self,
        workload: Workload,
        knobs: Knobs,
        *,
        dp: int,
        per_rank: int,
        objective: Objective = Objective.memory,
    ) -> None:
        self.workload, self.knobs, self.dp, self.per_rank = workload, knobs, dp, per_rank
        self.objective = objective
        self.totals: dict[int, int] = {}
        self.steps: dict[int, float | None] = {}  # predicted step seconds of each size weighed for speed

    def layout_at(self, micro: int) -> Layout:
        """The batch contract's layout at this micro-batch size (global = per_rank x dp)."""
        w, k = self.workload, self.knobs
        return resolve_layout(
            gpus=w.gpus,
            tp=k.spec.tp,
            pp=k.spec.pp,
            sp=k.spec.sp,
            global_size=self.per_rank * self.dp,
            micro_size=micro,
        )

    def memory(self, micro: int) -> MemoryTerms:
        """Memory terms at this micro-batch size (accum = per-rank sequences / micro)."""
        return memory_at(
            self.workload, self.knobs, micro_size=micro, dp=self.dp, accum_steps=self.per_rank // micro
        )

    def __call__(self, micro: int) -> bool:
        """True when this micro-batch's planned bytes fit the usable device memory."""
        if micro not in self.totals:
            self.totals[micro] = self.memory(micro).peak
        return self.totals[micro] <= self.workload.usable_bytes

    @property
    def none_fit(self) -> bool:
        """True when micro-batch sizes were tried and none of them fitted."""
        return bool(self.totals) and all(t > self.workload.usable_bytes for t in self.totals.values())

    def _usable(self) -> str:
        dev = self.workload.device.memory_bytes.value or 0.0
        return f"{gb(self.workload.usable_bytes)} usable ({gb(dev)} x headroom {self.workload.headroom:g})"

    def step_s(self, micro: int) -> float | None:
        """The predicted step at this micro-batch size (runner/step_time/estimate.py; None: no peak)."""
        if micro not in self.steps:
            w, k = self.workload, self.knobs
            layout = self.layout_at(micro)
            self.steps[micro] = step_time(w, k, layout, traffic(w, k, layout)).step_s
        return self.steps[micro]

    def choose(self, largest: int) -> int:
        """The size ``objective`` takes, given the largest that fits (runner.layout.resolve_layout's).

        ``memory``: ``largest``. ``speed``: of the divisors of global/dp up to ``largest`` that fit
        (each obeys resolve_layout's limits, being no larger), the largest whose predicted step is
        within :data:`SPEED_TIE` of the fastest; ``largest`` when a step cannot be predicted.
        """
        if self.objective != Objective.speed:
            return largest
        sizes = [m for m in divisors(self.per_rank) if m <= largest and self(m)]
        steps = {m: self.step_s(m) for m in sizes}
        known = {m: s for m, s in steps.items() if s is not None}
        if len(known) < len(sizes) or not known:
            return largest
        fastest = min(known.values())
        return max(m for m, s in known.items() if s <= fastest * (1 + SPEED_TIE))

    def _speed_words(self, chosen: int) -> str:
        """For the speed objective: the predicted steps of the sizes weighed, and why ``chosen``."""
        if self.objective != Objective.speed:
            return ""
        steps = {m: s for m, s in self.steps.items() if s is not None}
        if chosen not in steps or len(steps) < 2:
            if self.steps and chosen in self.steps and self.steps[chosen] is None:
                return "; no step-time prediction (no peak): the largest that fits"
            return ""
        fastest = min(steps, key=lambda m: steps[m])
        others = ", ".join(f"micro {m} {steps[m]:.3g} s" for m in sorted(steps, reverse=True) if m != chosen)
        if fastest == chosen:
            why = "predicted fastest"
        else:
            why = f"the largest within {SPEED_TIE:.0%} of the fastest (micro {fastest})"
        return (
            f"; chosen for predicted speed (planner.objective=speed): step {steps[chosen]:.3g} s, "
            f"{why}; {others}"
        )

    def reason(self, chosen: int) -> str:
        """Why `chosen` was taken: its bytes, the predicted steps weighed (speed), and what the next
        larger divisor would need."""
        total = self.totals.get(chosen, self.memory(chosen).peak)
        larger = sorted(m for m in self.totals if m > chosen and self.totals[m] > self.workload.usable_bytes)
        head = f"micro {chosen}: {gb(total)} of {self._usable()}" + self._speed_words(chosen)
        if larger:
            return f"{head}; micro {larger[0]} would need {gb(self.totals[larger[0]])}"
        pp = self.knobs.spec.pp
        if pp > 1 and chosen < self.per_rank:  # runner/layout.py most_pipeline_micro
            return (
                f"{head}; under a pipeline auto keeps {PIPELINE_MICRO_BATCHES_PER_STAGE} x pp = "
                f"{PIPELINE_MICRO_BATCHES_PER_STAGE * pp} micro-batches per step where global/dp = "
                f"{self.per_rank} has them (bubble (pp-1)/accum = {pp - 1}/{self.per_rank // chosen})"
            )
        if chosen < self.per_rank:  # runner/layout.py: one rank keeps two micro-batches per step
            return (
                f"{head}; the largest divisor below global {self.per_rank} on one rank, which keeps "
                f"two micro-batches per step for the noise scale"
            )
        return f"{head}; the largest divisor of global/dp = {self.per_rank}"

    def configured(self, micro: int) -> str:
        """The verdict on a micro-batch size the config fixed."""
        fits = self(micro)
        verb = "fits" if fits else "does NOT fit"
        return f"batch.micro_size={micro} as configured: {gb(self.totals[micro])} {verb} in {self._usable()}"

    def refusal(self, *, planning: bool = False) -> str:
        """Why nothing fits: micro 1's bytes and its largest term, and where to look next (a plan
        already shows each term: it points at planner.recommend=true alone)."""
        terms = self.memory(1)
        name, size = terms.largest()
        head = (
            f"batch.micro_size=auto: not even micro 1 fits: {gb(terms.peak)} > {self._usable()} "
            f"at dp={self.dp} ({name} {gb(size)})"
        )
        if planning:
            return (
                f"{head}; each term is below, and planner.recommend=true finds the cheapest layout that fits"
            )
        return (
            f"{head}; run with plan=true (or planner.recommend=true) to see each term and the cheapest "
            "layout that fits"
        )


__all__ = ["SPEED_TIE", "MicroFit", "memory_at"]
