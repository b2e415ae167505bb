"""SLURM sweeps: ``python train.py -m hydra/launcher=slurm parallel=zero1,zero3 gpus=8,16``.

The launching process (a login node) does everything that can refuse, before it submits
anything:

1. compose each cell's config and run the runner's own checks (schema, batch contract);
2. read the partition from ``sinfo`` and place each cell: nodes = ceil(gpus / per_node),
   tasks per node = gpus / nodes (launchers/slurm/resources.py); refuse a cell that does
   not split evenly, or that no set of the partition's nodes can ever hold;
3. refuse a value that could break out of its line in the batch script.

Then it submits one job array per group of cells that need the same resources (one
sbatch each; hydra-submitit-launcher would give every cell the first one's), waits,
cancels a job that SLURM says can never start, and hands Hydra one JobReturn per cell.
Each task of a job is one rank (launchers/slurm/task.py). A failed submission cancels
whatever the sweep had already queued.

Preemption and time limits (runner/train/preemption.py): submitit has SLURM signal the job
(SIGUSR2) ``signal_delay_s`` before its limit (sbatch --signal). The ranks save a
checkpoint after the step they are in; then rank 0 hands over to submitit's handler,
which calls the launcher's inherited ``checkpoint()`` (the same cell again) and requeues
the job (submitit docs/checkpointing.md); ``max_num_timeout`` caps the requeues after a
timeout. The requeued job re-enters the cell's run directory, and SLURM_RESTART_COUNT
makes it resume from the latest checkpoint. Meanwhile ``wait`` sees the job pending again.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from omegaconf import DictConfig, OmegaConf, open_dict

from launchers.cell_config import task_config
from launchers.compose import to_train_config
from launchers.slurm.partition import read_partition
from launchers.slurm.resources import (
    Partition,
    Placement,
    SlurmRefused,
    capacity_problems,
    gpu_problems,
    place,
    ranks_per_node,
)
from launchers.slurm.submission import Cell, sbatch_parameters, unsafe_values
from launchers.slurm.watch import cancel, collect, wait
from runner.checkpoint.size import disk_need, disk_problem, sweep_disk_problem
from runner.config import HostAllocator, Resume, TrainConfig
from runner.errors import ConfigError
from runner.exit_codes import ExitCode
from runner.layout import LayoutError
from runner.preflight.validate import batch_contract_problems, validate
from runner.preflight.wandb_credentials import credentials_problems

log = logging.getLogger("ladder.slurm")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _runner_problems(task_cfg: DictConfig) -> tuple[TrainConfig | None, list[str]]:
    """The cell's config and what the runner would refuse whatever host it runs on: config
    values, the batch contract (no config: it did not validate).

    Checks that read the host (CUDA devices, device memory for ``micro_size=auto`` under
    cluster=local) are left to the ranks: this process runs on the login node. The disk of
    the run directory is the cluster's shared one: :func:`plan_cell` checks it from here.
    """

    try:
        config = to_train_config(task_cfg)
        validate(config, launcher=None)
    except (ConfigError, LayoutError) as error:
        return None, [line.strip().removeprefix("- ") for line in str(error).splitlines() if line.strip()]
    return config, batch_contract_problems(config) + credentials_problems(config.logger)


def plan_cell(
    num: int, overrides: list[str], cell_cfg: DictConfig, partitions: dict[str | None, Partition]
) -> tuple[Cell | None, list[str]]:
    """Place one composed cell on its partition; the problems found instead, if any."""
    container = OmegaConf.to_container(cell_cfg.hydra.launcher, resolve=True)
    assert isinstance(container, dict)
    launcher = {str(key): value for key, value in container.items()}
    gpus = int(cell_cfg.gpus)
    cluster = cell_cfg.cluster
    config, problems = _runner_problems(task_config(cell_cfg))
    name = launcher.get("partition")
    if name not in partitions:
        partitions[name] = read_partition(name)
    partition = partitions[name]
    problems += gpu_problems(
        cluster=cluster.name, cluster_gpus_per_node=cluster.gpus_per_node, partition=partition
    )
    per_node, on_gpus = ranks_per_node(
        cluster_gpus_per_node=cluster.gpus_per_node,
        partition=partition,
        cpus_per_task=launcher.get("cpus_per_task"),
    )
    try:
        placement = place(
            gpus=gpus, per_node=per_node, on_gpus=on_gpus, what="GPUs" if on_gpus else "CPU ranks"
        )
    except SlurmRefused as error:
        return None, [*problems, str(error)]
    if not problems:
        problems += capacity_problems(
            placement,
            partition,
            gpus=gpus,
            per_node=per_node,
            cpus_per_task=launcher.get("cpus_per_task"),
            mem_gb=launcher.get("mem_gb"),
            timeout_min=int(launcher["timeout_min"]),
        )
    allocator = HostAllocator.auto if config is None else config.train.host_allocator
    params = sbatch_parameters(launcher, placement, PROJECT_ROOT, allocator)
    folder = str(launcher["submitit_folder"])
    problems += unsafe_values(params, folder)
    with open_dict(cell_cfg.hydra.job):
        cell_cfg.hydra.job.num = num  # as the task sets it; the sweep subdir is named after it
    run_dir = Path(str(cell_cfg.hydra.sweep.dir)) / str(cell_cfg.hydra.sweep.subdir)
    if config is not None and config.train.resume == Resume.never:
        problems += filter(None, [disk_problem(disk_need(config, run_dir), config)])
    cell = Cell(num, overrides, run_dir, placement, folder, int(launcher["max_num_timeout"]), params, config)
    return (None if problems else cell), problems


def plan_sweep(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Cell]:
    """Every cell placed, or SlurmRefused listing each problem with the cells it concerns."""
    partitions: dict[str | None, Partition] = {}
    cells: list[Cell] = []
    found: dict[str, list[str]] = {}
    for offset, overrides in enumerate(job_overrides):
        num = initial_job_idx + offset
        cell_cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
        cell, problems = plan_cell(num, list(overrides), cell_cfg, partitions)
        if cell is not None:
            cells.append(cell)
        label = f"#{num} ({' '.join(filter_overrides(overrides)) or 'defaults'})"
        for problem in problems:
            found.setdefault(problem, []).append(label)
    fresh = [
        cell.config for cell in cells if cell.config is not None and cell.config.train.resume == Resume.never
    ]
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    if not found and (disk := sweep_disk_problem(fresh, sweep_dir, at_once=True)) is not None:
        found[disk] = ["all of them"]
    if found:
        lines = [f"  - {problem}\n      cells: {', '.join(labels)}" for problem, labels in found.items()]
        raise SlurmRefused("nothing was submitted:\n" + "\n".join(lines))
    return cells


def _group_key(cell: Cell) -> str:
    return json.dumps([cell.folder, cell.max_num_timeout, cell.params], sort_keys=True, default=str)


def _describe(placement: Placement) -> str:
    gpus = f"{placement.gpus_per_node} GPUs" if placement.gpus_per_node is not None else "no GPUs"
    return f"{placement.nodes} node(s) x {placement.tasks_per_node} tasks, {gpus} per node"


def submit(launcher: Any, cells: list[Cell], jobs: dict[int, Any]) -> None:
    """One job array per group of like cells, each cell's job into ``jobs`` as it is queued; on a
    refusal, cancel what was queued and refuse."""
    # Deferred: submitit is needed only by a SLURM sweep.
    import submitit

    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(_group_key(cell), []).append(cell)
    for members in groups.values():
        first = members[0]
        executor = submitit.SlurmExecutor(folder=first.folder, max_num_timeout=first.max_num_timeout)
        executor.update_parameters(**first.params)
        args = [
            (list(c.overrides), "hydra.sweep.dir", c.num, f"job_id_for_{c.num}", Singleton.get_state())
            for c in members
        ]
        try:
            submitted = executor.map_array(launcher, *zip(*args, strict=True))
        except Exception as error:
            cancel(job.job_id for job in jobs.values())
            undone = f"; cancelled the {len(jobs)} job(s) it had already queued" if jobs else ""
            raise SlurmRefused(
                f"SLURM refused the sweep{undone}:\n  - {str(error).strip()}\n"
                f"      cells: {', '.join(c.label for c in members)}"
            ) from None
        for cell, job in zip(members, submitted, strict=True):
            jobs[cell.num] = job
        ids = ", ".join(job.job_id for job in submitted)
        log.info(
            "SLURM job(s) %s: %s (%s)", ids, ", ".join(c.label for c in members), _describe(first.placement)
        )


def launch_sweep(
    launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[JobReturn]:
    """Plan, submit and wait for one batch of sweep cells; refuses with SlurmRefused before submitting."""
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    cells = plan_sweep(launcher, job_overrides, initial_job_idx)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info("SLURM sweep of %d cell(s) into %s", len(cells), sweep_dir)
    jobs: dict[int, Any] = {}
    try:
        with ctrl_c_interrupts():
            submit(launcher, cells, jobs)
            never = wait(jobs)
    except KeyboardInterrupt:  # Ctrl-C stops this process watching; the jobs queued are SLURM's now
        print(stopped_watching(sweep_dir, [job.job_id for job in jobs.values()]), file=sys.stderr, flush=True)
        sys.exit(ExitCode.CTRL_C_AT_COMMAND)
    return collect(cells, jobs, never)


@contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """Within: SIGINT raises KeyboardInterrupt, even where this process was started with it ignored
    (a command a script ran with ``&``), as the local launcher takes SIGINT over for its ranks."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def stopped_watching(sweep_dir: Path, job_ids: list[str]) -> str:
    """What Ctrl-C on a SLURM sweep's launching process leaves: its jobs, and how to follow or stop them."""
    if not job_ids:
        return "\nladder: stopped while submitting, before sbatch named a job (squeue --me shows any queued)"
    ids = ",".join(job_ids)
    return (
        f"\nladder: stopped watching; the sweep's {len(job_ids)} job(s) go on in SLURM: {ids}\n"
        f"  follow them: squeue -j {ids}\n"
        f"  stop them: scancel {ids.replace(',', ' ')} (each rank saves a checkpoint at the SIGTERM, "
        f"within SLURM's KillWait)\n"
        f"  when they end: ladder report {sweep_dir}"
    )
