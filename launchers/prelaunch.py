"""The launching process's choices and refusals before any rank starts: DeepSpeed's config, the
plan of this run and what it refuses (more host memory than this host has). The layout itself is
runner/plan/planner.py ``layout_for_config``'s, as a plan of the same config shows it.
"""

from __future__ import annotations

import logging

from runner.config import TrainConfig
from runner.engine.deepspeed_config import build_deepspeed_config
from runner.engine.schedule import scaled_lr
from runner.errors import ConfigError
from runner.layout import Layout, LayoutError
from runner.memory_model.units import gb
from runner.plan.planner import Plan, layout_for_config, plan_chosen
from runner.preflight.validate import validate
from runner.rundir.json_types import JsonObject

log = logging.getLogger("ladder")


def deepspeed_config_for(config: TrainConfig, layout: Layout, *, load_universal: bool = False) -> JsonObject:
    """DeepSpeed's config for this run, with the learning rate scaled to its global batch."""
    return build_deepspeed_config(
        layout=layout,
        model=config.model,
        parallel=config.parallel,
        precision=config.precision,
        optimizer=config.optimizer,
        lr=scaled_lr(config.optimizer, global_size=layout.global_size),
        load_universal=load_universal,
    )


def launch_plan(config: TrainConfig, layout: Layout | None = None) -> Plan:
    """The plan of this run's own layout (``layout``: as chosen; None: choose it now), without the
    peak (a CPU measurement the run makes itself)."""
    return plan_chosen(config, layout if layout is not None else layout_for_config(config).layout)


def memory_warnings(plan: Plan) -> list[str]:
    """What the plan of this run says will not fit, device or host, with the numbers (empty: it fits).

    A warning, not a refusal: the device and host figures may be datasheet numbers, and the
    estimate is an upper bound in places (DESIGN.md: the planner proposes, the run measures).
    """
    warnings = []
    if not plan.fits:
        usable = plan.workload.usable_bytes
        warnings.append(
            f"the plan puts {gb(plan.memory.peak)} on each device, more than its {gb(usable)} usable: "
            "it will likely run out of device memory (plan=true shows the terms; "
            "planner.recommend=true the cheapest layout that fits)"
        )
    if not plan.host.fits:
        warnings.append(f"host memory per node: {plan.host.verdict()}")
    return warnings


def refuse_beyond_this_hosts_ram(plan: Plan) -> None:
    """Refuse a local launch whose host memory the plan puts beyond all of this host's RAM.

    Past the headroom the plan only warns (memory_warnings); past the RAM itself the kernel's
    out-of-memory killer would end a rank, or first some other program of the user's. The
    host plan is within a few percent of the measured RSS on a CPU, and at or above it on one
    H200 (CUDA's host side measured there; docs/benchmarks.md).
    """
    host = plan.host
    if host.peak_per_node <= host.ram_bytes:
        return
    fixes = "; ".join(fix for fix in host.fixes if not fix.startswith(("more nodes", "a larger host")))
    raise ConfigError(
        f"  - this host has {gb(host.ram_bytes)} of RAM [{host.ram_source}] and the plan needs "
        f"{gb(host.peak_per_node)} of it ({host.verdict()}): the out-of-memory killer would end a "
        f"rank, or another program first. planner.recommend=true finds the cheapest layout that "
        f"fits, plan=true shows every term{'; or ' + fixes if fixes else ''}"
    )


def local_launch_problems(config: TrainConfig) -> list[str]:
    """What ``run`` would refuse before starting this config's ranks on this host, one line each.

    A local sweep checks every cell with it before the first one trains
    (launchers/local_sweep.py). A run directory's own refusals (a resume onto another
    global batch) are not here: they depend on what the cell's directory holds then.
    """
    planning = config.planning
    try:
        validate(config, launcher=None if planning else "local")
        if not planning:
            refuse_beyond_this_hosts_ram(launch_plan(config, layout_for_config(config).layout))
    except (ConfigError, LayoutError) as error:
        return [line.strip().removeprefix("- ") for line in str(error).splitlines() if line.strip()]
    return []
