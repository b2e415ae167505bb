"""The exit status of ``plan=true``: one plan's verdict, or the worst of a sweep's.

launchers/plan_job.py gives each plan its status (plan.json's ``exit_code``): 0 it fits and holds
the batch contract, 3 it does not fit, 4 it holds the contract only at another global batch.
Hydra drops a task's return value, so train.py notes each plan's status here and exits with
it once Hydra is done. A sweep of plans (``-m plan=true ...``) plans every cell whatever each
says, then exits 3 if any cell does not fit, else 4 if any misses the contract, else 0, and
names those cells.
"""

from __future__ import annotations

from runner.exit_codes import ExitCode

# What a status says of one plan, and of several.
WORDS = {
    ExitCode.PLAN_DOES_NOT_FIT: ("does not fit", "do not fit"),
    ExitCode.PLAN_CONTRACT_NOT_MET: (
        "holds the batch contract only at another global batch",
        "hold the batch contract only at another global batch",
    ),
}

# (the sweep's cell number or None, its overrides, its plan's exit status), in planning order.
PLANNED: list[tuple[int | None, list[str], ExitCode]] = []


def note(cell: int | None, overrides: list[str], code: ExitCode) -> None:
    """Record one plan's status: a sweep's cell ``cell`` (None: a single run) with its overrides."""
    PLANNED.append((cell, list(overrides), code))


def exit_code() -> ExitCode:
    """The command's status: the plan's, or a sweep's worst (3 before 4); 0 when nothing was planned."""
    codes = {code for _, _, code in PLANNED}
    return next((code for code in WORDS if code in codes), ExitCode.OK)


def _labels() -> list[str]:
    """Each sweep cell as ``#3 (parallel=zero3 gpus=64)``: the overrides its cells do not share."""
    common = set.intersection(*(set(overrides) for _, overrides, _ in PLANNED))
    return [
        f"#{cell} ({' '.join(o for o in overrides if o not in common) or 'defaults'})"
        for cell, overrides, _ in PLANNED
    ]


def summary() -> str | None:
    """What a status other than 0 means (naming a sweep's cells); None when every plan fits."""
    if len(PLANNED) == 1 and PLANNED[0][2] in WORDS:
        code = PLANNED[0][2]
        return f"ladder: the plan {WORDS[code][0]} (exit {code})"
    lines = []
    labels = _labels() if PLANNED else []
    for code, (_, words) in WORDS.items():
        cells = [label for label, (_, _, said) in zip(labels, PLANNED, strict=True) if said == code]
        if cells:
            lines.append(
                f"ladder: {len(cells)} of {len(PLANNED)} plans {words} (exit {code}): {', '.join(cells)}"
            )
    return "\n".join(lines) or None
