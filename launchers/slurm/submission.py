"""One sweep cell as submitted: its sbatch parameters, and the check that none leaves its line.

submitit writes them into the batch script as ``#SBATCH --key=value`` lines with the
value passed through ``shlex.quote`` (submitit/slurm/slurm.py, ``_as_sbatch_flag``), and
quotes the paths in the ``srun ... python -u -m submitit.core._submit FOLDER`` line.
sbatch strips those quotes again. Quoting cannot help with a line break: a job name
holding one would end its ``#SBATCH`` line and put the rest on a line bash runs. So
every value that reaches the script is refused when it holds a control character, and
``additional_parameters`` keys must look like sbatch option names. ``setup`` lines are
shell commands on purpose (submitit runs them before srun) and are not checked.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import filter_overrides

from launchers.slurm.resources import Placement
from runner.config import HostAllocator, TrainConfig
from runner.hardware.host_allocator import INSTALL_HINT, JEMALLOC_CONF, JEMALLOC_SONAME, rank_allocator

# hydra.launcher fields that become sbatch options, by submitit's SlurmExecutor name
# (the keyword arguments of submitit/slurm/slurm.py `_make_sbatch_string`).
_PASSED_AS_IS = ("partition", "account", "qos", "constraint", "exclude", "comment", "cpus_per_task")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OPTION_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class Cell:
    """One sweep cell as submitted: its number, overrides, placement and sbatch parameters."""

    num: int
    overrides: list[str]
    run_dir: Path
    placement: Placement
    folder: str
    max_num_timeout: int
    params: dict[str, Any]
    config: TrainConfig | None = None  # the cell's typed config, for the sweep's disk check

    @property
    def label(self) -> str:
        """``#1 (parallel=zero3 gpus=16)`` for messages."""
        return f"#{self.num} ({' '.join(filter_overrides(self.overrides)) or 'defaults'})"


def pythonpath_line(project_root: Path) -> str:
    """A setup line that lets every task import this project (runner, launchers, hydra_plugins)."""
    return f"export PYTHONPATH={shlex.quote(str(project_root))}${{PYTHONPATH:+:$PYTHONPATH}}"


def allocator_lines(choice: HostAllocator, placement: Placement) -> list[str]:
    """Setup lines that give the cell's ranks the C allocator the local launcher would give them
    (``train.host_allocator``, runner/hardware/host_allocator.py): jemalloc on CPU ranks where the
    node has it (``auto``); with ``jemalloc`` on any rank, and the job ends before srun, saying so,
    on a node without it. srun passes the batch script's environment on to every task."""
    wanted = rank_allocator(choice, cpu_rank=placement.gpus_per_node is None, environ={}, installed=True)
    if not wanted.keeps_freed_memory:
        return []
    export = (
        f'export LD_PRELOAD="{JEMALLOC_SONAME}${{LD_PRELOAD:+ $LD_PRELOAD}}" '
        f'MALLOC_CONF="{JEMALLOC_CONF}${{MALLOC_CONF:+,$MALLOC_CONF}}"'
    )
    found = f"{{ ldconfig -p || /sbin/ldconfig -p; }} 2>/dev/null | grep -qF {JEMALLOC_SONAME}"
    if choice != HostAllocator.jemalloc:
        return [f"if {found}; then {export}; fi"]
    missing = (
        f'echo "ladder: train.host_allocator=jemalloc: {JEMALLOC_SONAME} is not installed on $(hostname); '
        f'install it ({INSTALL_HINT}) or set train.host_allocator=auto" >&2; exit 1'
    )
    return [f"if {found}; then {export}; else {missing}; fi"]


def sbatch_parameters(
    launcher: Mapping[str, Any],
    placement: Placement,
    project_root: Path,
    allocator: HostAllocator = HostAllocator.auto,
) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one cell: the user's fields plus its placement, and
    its ranks' C allocator (:func:`allocator_lines`)."""
    params: dict[str, Any] = {key: launcher[key] for key in _PASSED_AS_IS if launcher.get(key) is not None}
    params.update(
        job_name=str(launcher["name"]),
        time=int(launcher["timeout_min"]),
        nodes=placement.nodes,
        ntasks_per_node=placement.tasks_per_node,
        array_parallelism=int(launcher["array_parallelism"]),
        signal_delay_s=int(launcher["signal_delay_s"]),
        stderr_to_stdout=bool(launcher["stderr_to_stdout"]),
        setup=[
            pythonpath_line(project_root),
            *allocator_lines(allocator, placement),
            *(launcher.get("setup") or []),
        ],
        # srun(1) -K: when one rank fails, end the step, as the local launcher stops the
        # others, rather than leave them waiting in a collective for a rank that is gone.
        srun_args=["--kill-on-bad-exit=1"],
    )
    if placement.gpus_per_node is not None:  # only where the nodes have GPUs
        params["gpus_per_node"] = placement.gpus_per_node
    if launcher.get("mem_gb") is not None:
        params["mem"] = f"{int(launcher['mem_gb'])}G"
    if launcher.get("additional_parameters"):
        params["additional_parameters"] = dict(launcher["additional_parameters"])
    return params


def unsafe_values(params: Mapping[str, Any], folder: str) -> list[str]:
    """Values that could leave their line in the batch script (``setup`` is shell by design)."""
    problems: list[str] = []

    def check(key: str, value: Any) -> None:
        if isinstance(value, str) and _CONTROL.search(value):
            problems.append(
                f"hydra.launcher.{key}={value!r} holds a control character (a line break would end "
                f"its #SBATCH line and hand the rest to the shell); remove it"
            )

    check("submitit_folder", folder)
    for key, value in params.items():
        if key in ("setup", "srun_args"):
            continue
        if key == "additional_parameters":
            for name, extra in value.items():
                if not _OPTION_NAME.match(str(name)):
                    problems.append(
                        f"hydra.launcher.additional_parameters: {name!r} is not an sbatch option name "
                        f"(letters, digits, - and _)"
                    )
                check(f"additional_parameters.{name}", extra)
            continue
        check("name" if key == "job_name" else key, value)
    return problems
