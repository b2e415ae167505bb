"""The SLURM side of a sweep: what each task of a cell's job runs (one rank of that cell).

submitit starts ``nodes x tasks_per_node`` copies of ``python -m submitit.core._submit``
with srun; each unpickles the launcher and calls it, which lands here. Each copy
composes the cell's config and runs the Hydra task function (train.py's ``main``); the
runner reads SLURM_PROCID / SLURM_NTASKS (runner/environment.py) and makes the task
that rank. This mirrors hydra-submitit-launcher's ``BaseSubmititLauncher.__call__``
with three changes: only rank 0 writes ``.hydra/``; a task that fails raises (a
``sys.exit`` becomes an exception), so submitit records the failure at once and the
task exits non-zero, which ends its job step (srun --kill-on-bad-exit); a task that
succeeded exits without interpreter teardown. A task stopped at SLURM's signal after a
checkpoint (runner/train/preemption.py) exits 75 and leaves no result: its job was requeued.
So does a task whose collective lost its peer (runner/diagnose/peer_loss.py; it exits 1): a lost
node is one SLURM may requeue the job for (NODE_FAIL), and the job's next run must not find this
run's error as its result. Its reason is in the cell's summary.json either way.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from omegaconf import open_dict

from launchers.worker import exit_now
from runner.diagnose.peer_loss import is_peer_lost
from runner.exit_codes import ExitCode
from runner.train.preemption import Preempted


class TaskExited(RuntimeError):
    """The task function called sys.exit with a failure code; its reason is in the task's stderr."""


def run_task(
    launcher: Any,
    sweep_overrides: list[str],
    job_dir_key: str,
    job_num: int,
    singleton_state: dict[type, Singleton],
) -> JobReturn:
    """Compose this cell's config and run the task function as this SLURM task's rank."""
    # Deferred: submitit is needed only by a SLURM sweep.
    import submitit

    Singleton.set_state(singleton_state)
    setup_globals()
    sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, sweep_overrides)
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    with open_dict(sweep_config.hydra):
        sweep_config.hydra.job.id = submitit.JobEnvironment().job_id
        sweep_config.hydra.job.num = job_num
        if rank != 0:
            sweep_config.hydra.output_subdir = None  # every rank would write the same .hydra/ files
    try:
        ret = run_job(
            hydra_context=launcher.hydra_context,
            task_function=launcher.task_function,
            config=sweep_config,
            job_dir_key=job_dir_key,
            job_subdir_key="hydra.sweep.subdir",
        )
    except Preempted:
        # Stopped at SLURM's signal after a checkpoint, the job requeued or ending: no result,
        # or the launching process would take it for the cell's (runner/train/preemption.py).
        exit_now(ExitCode.STOPPED_RESUMABLE)
        raise  # not reached
    except SystemExit as exit_:
        if exit_.code in (ExitCode.OK, None):
            raise
        raise TaskExited(
            f"rank {rank}: train.py exited with code {exit_.code}; its reason is in this task's stderr"
        ) from None
    if ret.status == JobStatus.FAILED:
        # Raise what the task raised (Hydra returns it): the task then exits non-zero, and srun
        # --kill-on-bad-exit stops the other ranks instead of leaving them in a collective.
        try:
            _ = ret.return_value
        except Exception as error:
            if is_peer_lost(error):  # another rank, or its node, is gone: no result (see above)
                exit_now(ExitCode.FAILED)
            raise
    # submitit writes the result after this returns; then leave before interpreter teardown,
    # whose gloo / DeepSpeed destructors abort now and then (launchers/worker.py exit_now)
    # and would make srun kill the ranks still writing theirs.
    atexit.register(exit_now, ExitCode.OK)
    return ret
