"""The SLURM job a run ran in, as ``summary.json`` records it: job id, nodes and tasks.

Read from the variables SLURM exports to every task (sbatch(1) and srun(1),
"OUTPUT ENVIRONMENT VARIABLES").
"""

from __future__ import annotations

from collections.abc import Mapping

from runner.rundir.summary_records import SlurmRecord


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def slurm_job_record(environ: Mapping[str, str]) -> SlurmRecord | None:
    """Job id, array ids, partition, nodes and tasks of the enclosing SLURM job; None outside one."""
    if "SLURM_JOB_ID" not in environ:
        return None
    return {
        "job_id": environ["SLURM_JOB_ID"],
        "array_job_id": environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": _int(environ.get("SLURM_ARRAY_TASK_ID")),
        "job_name": environ.get("SLURM_JOB_NAME"),
        "partition": environ.get("SLURM_JOB_PARTITION"),
        "nodes": _int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES"))),
        "nodelist": environ.get("SLURM_JOB_NODELIST"),
        "tasks": _int(environ.get("SLURM_NTASKS")),
        "tasks_per_node": _int(environ.get("SLURM_NTASKS_PER_NODE")),
        "restarts": _int(environ.get("SLURM_RESTART_COUNT")) or 0,  # requeues so far (sbatch(1))
    }
