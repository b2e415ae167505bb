"""The host RAM a plan counts is capped by this process's cgroup, its own or an ancestor's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import ROOT, capped_cgroup

from runner.hardware.cgroup_memory import cgroup_memory_limit, memory_cgroup_dirs

pytestmark = pytest.mark.unit


def _proc(tmp_path: Path, mountinfo: str, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mountinfo)
    (proc / "cgroup").write_text(cgroup)
    return proc


def test_a_slurm_jobs_cap_on_an_ancestor_binds_its_task_under_cgroup_v2(tmp_path: Path):
    """SLURM's task/cgroup layout: the job's memory.max, tasks two levels below with none."""
    mount = tmp_path / "cgroup"
    job = mount / "system.slice" / "slurmstepd.scope" / "job_42"
    task = job / "step_0" / "user" / "task_0"
    task.mkdir(parents=True)
    (task / "memory.max").write_text("max\n")
    (job / "step_0" / "memory.max").write_text("max\n")
    (job / "memory.max").write_text(f"{64 * 2**30}\n")  # sbatch --mem=64G
    (mount / "system.slice" / "memory.max").write_text(f"{512 * 2**30}\n")
    proc = _proc(
        tmp_path,
        f"35 24 0:30 / {mount} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n",
        "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
    )
    assert memory_cgroup_dirs(proc)[0] == (task, "memory.max")
    assert memory_cgroup_dirs(proc)[-1] == (mount, "memory.max")
    assert cgroup_memory_limit(proc) == 64 * 2**30


def test_a_v1_memory_hierarchy_is_found_beside_the_others_and_no_cap_is_none(tmp_path: Path):
    memory, cpu = tmp_path / "memory", tmp_path / "cpu"
    (memory / "docker" / "abc").mkdir(parents=True)
    (memory / "docker" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # none
    mountinfo = (
        f"30 24 0:26 / {cpu} rw - cgroup cgroup rw,cpu\n31 24 0:27 / {memory} rw - cgroup cgroup rw,memory\n"
    )
    proc = _proc(tmp_path, mountinfo, "4:memory:/docker/abc\n1:cpu:/docker/abc\n0::/\n")
    assert memory_cgroup_dirs(proc)[0] == (memory / "docker" / "abc", "memory.limit_in_bytes")
    assert cgroup_memory_limit(proc) is None
    (memory / "docker" / "memory.limit_in_bytes").write_text(f"{8 * 2**30}\n")
    assert cgroup_memory_limit(proc) == 8 * 2**30


def test_a_process_in_a_capped_cgroup_plans_with_its_cap_not_the_physical_ram():
    """A real child cgroup with a 3 GB cap: a process moved into it counts 3 GB of host RAM."""
    with capped_cgroup(3 * 2**30) as (child, join):
        cap = int((child / memory_cgroup_dirs()[0][1]).read_text())  # the kernel rounds it to a page
        code = "from runner.step_time.device_figures import host_ram_bytes; print(*host_ram_bytes())"
        child_run = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, preexec_fn=join
        )
    assert child_run.returncode == 0, child_run.stderr
    printed = child_run.stdout.split(maxsplit=1)
    assert (int(printed[0]), printed[1].strip()) == (cap, "cgroup memory limit")
