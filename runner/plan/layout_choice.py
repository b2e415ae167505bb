"""The layout a run takes and a plan plans: the batch contract resolved, ``micro_size=auto`` chosen.

:func:`choose_layout` is the one place that decides it: the launcher before any rank starts
(runner/plan/planner.py ``layout_for_config``, called by launchers/prelaunch.py and
launchers/resume.py) and the planner for every layout it plans (``plan_layout``: ``plan=true``,
the ladder) call it, so a plan shows the layout its run would take, in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import Objective
from runner.layout import Layout, LayoutError, data_parallel_size, resolve_layout
from runner.plan.micro_fit import MicroFit
from runner.step_time.workload import Knobs, Workload


@dataclass(frozen=True)
class LayoutChoice:
    """A layout as chosen, and why."""

    layout: Layout
    # Why this micro-batch: for auto its bytes against the device (and the steps weighed, by
    # speed); planned, a configured size's verdict. None: a run's configured size, not weighed.
    reason: str | None
    # Planned only (``refuse=False``): why the configured global batch or micro-batch could not
    # be held; the layout is then the nearest that can (a larger global batch, or auto).
    contract_error: str | None = None


def _global_to_split(workload: Workload, knobs: Knobs, dp: int, *, refuse: bool) -> tuple[int, str | None]:
    """The global batch to split: the configured one; or, not refusing, the smallest multiple of dp
    above it with the contract's error (runner.layout.resolve_layout's words)."""
    try:
        resolve_layout(
            gpus=workload.gpus,
            tp=knobs.spec.tp,
            pp=knobs.spec.pp,
            global_size=workload.global_size,
            micro_size=1,
            sp=knobs.spec.sp,
        )
    except LayoutError as error:
        if refuse:
            raise
        return -(-workload.global_size // dp) * dp, str(error)
    return workload.global_size, None


def choose_layout(
    workload: Workload, knobs: Knobs, *, objective: Objective = Objective.memory, refuse: bool = True
) -> LayoutChoice:
    """The layout of these knobs: the batch contract, and for ``micro_size=auto`` the largest size
    that fits (runner.layout.resolve_layout with :class:`MicroFit`), then the one ``objective``
    takes (:meth:`MicroFit.choose`), with the words that say why.

    ``refuse=True`` (a run) raises LayoutError where the global batch cannot be split or no
    micro-batch fits. ``refuse=False`` (a plan, so that a sweep answers every cell) plans the
    nearest instead and says why: the smallest multiple of dp above the global batch, auto in
    place of a micro-batch that does not divide global/dp (``contract_error``), micro 1 when
    none fits (``reason``).
    """
    dp = data_parallel_size(gpus=workload.gpus, tp=knobs.spec.tp, pp=knobs.spec.pp, sp=knobs.spec.sp)
    global_size, contract_error = _global_to_split(workload, knobs, dp, refuse=refuse)
    per_rank = global_size // dp
    fit = MicroFit(workload, knobs, dp=dp, per_rank=per_rank, objective=objective)
    micro = knobs.micro_size
    if micro is not None and per_rank % micro and not refuse:
        contract_error = contract_error or f"batch.micro_size={micro} does not divide global/dp = {per_rank}"
        micro = None
    if micro is not None:
        return LayoutChoice(fit.layout_at(micro), fit.configured(micro), contract_error)
    try:
        layout = resolve_layout(
            gpus=workload.gpus,
            tp=knobs.spec.tp,
            pp=knobs.spec.pp,
            global_size=global_size,
            micro_size=None,
            fits=fit,
            sp=knobs.spec.sp,
        )
    except LayoutError as error:
        if not fit.none_fit:
            raise
        if refuse:
            raise LayoutError(fit.refusal()) from error
        return LayoutChoice(fit.layout_at(1), fit.refusal(planning=True), contract_error)
    chosen = fit.choose(layout.micro_size)
    if chosen != layout.micro_size:
        layout = fit.layout_at(chosen)
    return LayoutChoice(layout, fit.reason(layout.micro_size), contract_error)


__all__ = ["LayoutChoice", "choose_layout"]
