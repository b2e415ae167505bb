"""A real one-minute time limit on a two-node job: SLURM's warning signal, a checkpoint, a requeue.

slurmctld checks time limits every 30 s (PERIODIC_TIMEOUT), and sends ``--signal=USR2@5`` at
the first check less than 5 + 30 s before the limit: 25 to 55 s after the job starts. The
job's steps are slowed (LADDER_INJECT_STEP_S, tests/step_faults.py: 3 s after each, a minute
of steps) so that the limit falls mid-run on any machine, and a later run may be warned again
before it finishes: each warning must save, requeue and resume.
"""

from __future__ import annotations

import pytest
from multinode_runs import STEPS, STOPPED, job_id, losses, max_difference, summary
from train_helpers import injecting

pytestmark = pytest.mark.multinode

SLOW = injecting(LADDER_INJECT_STEP_S="3")
LIMIT = [
    "hydra.launcher.timeout_min=1",
    "hydra.launcher.signal_delay_s=5",
    "hydra.launcher.max_num_timeout=5",
]


def test_a_job_past_its_time_limit_saves_at_the_warning_requeues_and_ends_with_the_uninterrupted_losses(
    two_nodes, launch, uninterrupted, tmp_path, report
):
    sweep = launch(tmp_path / "sweep", *STOPPED, *LIMIT, env=SLOW)
    returncode, stderr = sweep.finish(timeout=420)
    assert returncode == 0, stderr[-4000:]

    recorded = summary(sweep.run_dir)
    job = job_id(sweep.run_dir)
    assert (recorded["status"], recorded["steps_completed"]) == ("completed", STEPS)
    shown = two_nodes.client("scontrol", "show", "job", job).stdout
    assert "TimeLimit=00:01:00" in shown, shown
    stops = recorded["interruptions"]
    assert stops, "the job finished before its time limit: no warning came"
    for restart, stop in enumerate(stops):
        assert (stop["signal"], stop["requeued"], stop["slurm_restart"]) == ("SIGUSR2", True, restart)
    assert 0 < stops[0]["completed_steps"] < STEPS
    assert recorded["resumed_from_step"] == stops[-1]["completed_steps"]
    assert recorded["slurm"]["restarts"] == len(stops)
    worst = max_difference(losses(sweep.run_dir), losses(uninterrupted.sweep_dir / "0"))
    report(
        f"time limit: job {job} (--time=1, --signal=USR2@5) warned {len(stops)} time(s), after steps "
        f"{[s['completed_steps'] for s in stops]}; max |loss - uninterrupted| = {worst:.3g}"
    )
    assert worst == 0.0
