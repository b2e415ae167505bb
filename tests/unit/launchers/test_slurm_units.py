"""SLURM launcher arithmetic, parsing, quoting and rank wiring, with no cluster needed."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from train_helpers import ROOT

from launchers.compose import register_configs
from launchers.slurm.job import slurm_job_record
from launchers.slurm.launcher import plan_cell
from launchers.slurm.partition import gres_gpus, parse_sinfo, parse_time_min
from launchers.slurm.resources import (
    NodeGroup,
    Partition,
    Placement,
    SlurmRefused,
    capacity_problems,
    gpu_problems,
    nearest_even_splits,
    place,
    ranks_per_node,
)
from launchers.slurm.submission import sbatch_parameters, unsafe_values
from launchers.slurm.watch import never_starts, stuck_jobs
from runner.config import HostAllocator
from runner.environment import from_environment, slurm_port
from runner.hardware.host_allocator import JEMALLOC_CONF, JEMALLOC_SONAME, jemalloc_installed

pytestmark = pytest.mark.unit

CPU_NODE = Partition("debug", (NodeGroup(count=1, cpus=2, memory_mb=16000, gpus=0),))
GPU_NODES = Partition("gpu", (NodeGroup(count=2, cpus=96, memory_mb=1_000_000, gpus=8),), max_time_min=2880)
LAUNCHER = {
    "name": "train",
    "timeout_min": 60,
    "array_parallelism": 256,
    "signal_delay_s": 120,
    "stderr_to_stdout": False,
    "partition": "gpu",
}
HOSTILE = "x y; touch PWNED_A $(touch PWNED_B) `touch PWNED_C` 'q' \"d\""


# --- placement: nodes = ceil(gpus / per_node), tasks per node = gpus / nodes -----------------


@pytest.mark.parametrize(
    ("gpus", "per_node", "on_gpus", "expected"),
    [
        (16, 8, True, Placement(2, 8, 8)),
        (64, 8, True, Placement(8, 8, 8)),
        (12, 8, True, Placement(2, 6, 6)),
        (4, 8, True, Placement(1, 4, 4)),
        (2, 2, False, Placement(1, 2, None)),
        (1, 2, False, Placement(1, 1, None)),
    ],
)
def test_placement_splits_ranks_over_the_fewest_nodes(gpus, per_node, on_gpus, expected):
    assert place(gpus=gpus, per_node=per_node, on_gpus=on_gpus, what="GPUs") == expected


def test_gpus_that_do_not_split_evenly_are_refused_with_the_nearest_that_do():
    with pytest.raises(SlurmRefused) as info:
        place(gpus=9, per_node=8, on_gpus=True, what="GPUs")
    message = str(info.value)
    assert "ceil(9 / 8) = 2 nodes" in message
    assert "9 / 2 = 4.5 per node" in message
    assert "try gpus=8 or gpus=10" in message
    assert nearest_even_splits(17, 8) == (16, 18)


def test_ranks_per_node_come_from_the_cluster_group_else_the_partition():
    assert ranks_per_node(cluster_gpus_per_node=8, partition=GPU_NODES, cpus_per_task=None) == (8, True)
    assert ranks_per_node(cluster_gpus_per_node=None, partition=GPU_NODES, cpus_per_task=None) == (8, True)
    # A CPU-only partition: one rank per CPU (per cpus_per_task CPUs), and no GPUs requested.
    assert ranks_per_node(cluster_gpus_per_node=None, partition=CPU_NODE, cpus_per_task=None) == (2, False)
    assert ranks_per_node(cluster_gpus_per_node=None, partition=CPU_NODE, cpus_per_task=2) == (1, False)


def test_a_gpu_cluster_group_on_a_partition_without_gpus_is_refused():
    (problem,) = gpu_problems(cluster="a100_80g", cluster_gpus_per_node=8, partition=CPU_NODE)
    assert "cluster=a100_80g has gpus_per_node=8" in problem
    assert "no GPUs" in problem
    assert gpu_problems(cluster="local", cluster_gpus_per_node=None, partition=CPU_NODE) == []


def _capacity(gpus, partition=GPU_NODES, per_node=8, on_gpus=True, **kwargs):
    placement = place(gpus=gpus, per_node=per_node, on_gpus=on_gpus, what="GPUs")
    options = {"cpus_per_task": None, "mem_gb": None, "timeout_min": 60, **kwargs}
    return capacity_problems(placement, partition, gpus=gpus, per_node=per_node, **options)


def test_a_request_the_partition_can_hold_passes():
    assert _capacity(16) == []
    assert _capacity(2, CPU_NODE, per_node=2, on_gpus=False) == []


def test_more_nodes_than_the_partition_has_is_refused_with_counts_that_fit():
    (problem,) = _capacity(24)
    assert "gpus=24 needs 3 nodes" in problem
    assert "partition 'gpu' has 2 nodes x 96 CPUs" in problem
    assert "try gpus in {7, 8, 10, 12, 14, 16}" in problem


def test_more_cpus_or_memory_per_node_than_any_node_has_is_refused():
    (cpus,) = _capacity(2, CPU_NODE, per_node=2, on_gpus=False, cpus_per_task=2)
    assert "2 tasks x 2 CPUs" in cpus
    (memory,) = _capacity(8, mem_gb=2000)
    assert "2000G memory" in memory
    assert "0 nodes of them can hold that" in memory


def test_a_time_limit_over_the_partitions_is_refused():
    (problem,) = _capacity(8, timeout_min=3000)
    assert "timeout_min=3000 exceeds the time limit of partition 'gpu' (2880 min)" in problem


# --- sinfo ------------------------------------------------------------------------------------

SINFO = """debug*|1|2|17745|(null)|infinite
gpu|4|96|1000000|gpu:a100:8(S:0-1)|2-00:00:00
gpu|2|96+|1000000|gpu:h100:4,gpu:a100:4|2-00:00:00
"""


def test_sinfo_lines_become_node_groups_of_the_chosen_partition():
    default = parse_sinfo(SINFO, None)
    assert default == Partition("debug", (NodeGroup(1, 2, 17745, 0),), max_time_min=None)
    gpu = parse_sinfo(SINFO, "gpu")
    assert [(g.count, g.gpus) for g in gpu.groups] == [(4, 8), (2, 8)]
    assert gpu.max_time_min == 2 * 24 * 60
    with pytest.raises(SlurmRefused, match=r"no partition 'big'.*debug, gpu"):
        parse_sinfo(SINFO, "big")


@pytest.mark.parametrize(
    ("gres", "gpus"), [("(null)", 0), ("gpu:8", 8), ("gpu:a100:8(S:0-1)", 8), ("gpu:a:4,gpu:b:2,fpga:1", 6)]
)
def test_gres_gpus(gres, gpus):
    assert gres_gpus(gres) == gpus


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("30", 30), ("30:00", 30), ("1:30:00", 90), ("1-12:00:00", 2160), ("2-0", 2880), ("infinite", None)],
)
def test_slurm_time_limits_in_minutes(text, minutes):
    assert parse_time_min(text) == minutes


# --- what reaches the batch script ------------------------------------------------------------


def test_a_line_break_in_any_value_is_refused_but_shell_characters_are_not():
    params = sbatch_parameters({**LAUNCHER, "name": "a\nrm -rf ~"}, Placement(1, 2, None), ROOT)
    (problem,) = unsafe_values(params, folder="/tmp/x")
    assert "hydra.launcher.name" in problem and "control character" in problem
    assert (
        unsafe_values(sbatch_parameters({**LAUNCHER, "name": HOSTILE}, Placement(1, 2, None), ROOT), HOSTILE)
        == []
    )
    bad_key = sbatch_parameters(
        {**LAUNCHER, "additional_parameters": {"mail-type\nx": "END"}}, Placement(1, 2, None), ROOT
    )
    assert "not an sbatch option name" in unsafe_values(bad_key, "/tmp/x")[0]


def _batch_script(monkeypatch, folder: Path, params: dict) -> str:
    """The exact text submitit would hand to sbatch for these parameters."""
    from submitit.slurm.slurm import SlurmExecutor

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # no srun here
    executor = SlurmExecutor(folder=folder, max_num_timeout=0)
    executor.update_parameters(**params)
    return executor._make_submission_file_text(executor._submitit_command_str, uid="test")


def test_override_values_reach_the_batch_script_quoted(monkeypatch, tmp_path):
    folder = tmp_path / f"sweep {HOSTILE}" / ".submitit" / "%j"
    project_root = tmp_path / "ladder $(touch PWNED_ROOT)"
    params = sbatch_parameters({**LAUNCHER, "name": HOSTILE}, Placement(2, 8, 8), project_root)
    script = _batch_script(monkeypatch, folder, params)

    sbatch_lines = [line[len("#SBATCH ") :] for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert [f"--job-name={HOSTILE}"] in [shlex.split(line) for line in sbatch_lines]
    for option in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--partition=gpu"):
        assert option in sbatch_lines

    # Run the script's shell part with a stand-in srun that records what it was given.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    record = tmp_path / "srun_args"
    srun.write_text(f'#!/bin/bash\nprintf "%s\\0" "$PYTHONPATH" "$@" > {shlex.quote(str(record))}\n')
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    script_path = tmp_path / "job.sh"
    script_path.write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ""}
    subprocess.run(["bash", str(script_path)], cwd=tmp_path, env=env, check=True, timeout=30)

    pythonpath, *argv = record.read_bytes().decode().split("\0")[:-1]
    assert pythonpath == str(project_root)
    assert "--kill-on-bad-exit=1" in argv
    assert argv[-5:] == [sys.executable, "-u", "-m", "submitit.core._submit", str(folder)]
    assert not list(tmp_path.rglob("PWNED*")), "a value reached the shell unquoted"


def _after_setup(params: dict, *, jemalloc_found: bool | None) -> subprocess.CompletedProcess[str]:
    """The batch script's setup lines run in bash, then LD_PRELOAD and MALLOC_CONF printed; with
    ``jemalloc_found`` set, ldconfig answers as on a node with (or without) it."""
    fake = ""
    if jemalloc_found is not None:
        listed = "libjemalloc.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
        fake = f"ldconfig() {{ echo '{listed if jemalloc_found else 'libc.so.6'}'; }}\n"
    lines = "\n".join(params["setup"])
    script = f'{fake}{lines}\nprintf "%s|%s" "$LD_PRELOAD" "$MALLOC_CONF"\n'
    env = {**os.environ, "LD_PRELOAD": "", "MALLOC_CONF": ""}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def test_cpu_ranks_under_slurm_get_the_allocator_the_local_launcher_gives_them():
    cpu, gpu = Placement(1, 2, None), Placement(1, 8, 8)
    # this host's answer, from the probe the local launcher uses
    done = _after_setup(sbatch_parameters(LAUNCHER, cpu, ROOT), jemalloc_found=None)
    preload, conf = done.stdout.split("|")
    assert (preload == JEMALLOC_SONAME) == jemalloc_installed() and (
        conf == JEMALLOC_CONF
    ) == jemalloc_installed()
    # and either branch, whatever this host has
    found = _after_setup(sbatch_parameters(LAUNCHER, cpu, ROOT), jemalloc_found=True)
    assert found.stdout == f"{JEMALLOC_SONAME}|{JEMALLOC_CONF}"
    assert _after_setup(sbatch_parameters(LAUNCHER, cpu, ROOT), jemalloc_found=False).stdout == "|"
    # a GPU's ranks keep the system's allocator, as does a cell that asks for it
    assert _after_setup(sbatch_parameters(LAUNCHER, gpu, ROOT), jemalloc_found=True).stdout == "|"
    system = sbatch_parameters(LAUNCHER, cpu, ROOT, HostAllocator.system)
    assert _after_setup(system, jemalloc_found=True).stdout == "|"
    # jemalloc asked for on a node without it: the job ends before srun, saying what to do
    asked = sbatch_parameters(LAUNCHER, gpu, ROOT, HostAllocator.jemalloc)
    assert _after_setup(asked, jemalloc_found=True).stdout == f"{JEMALLOC_SONAME}|{JEMALLOC_CONF}"
    missing = _after_setup(asked, jemalloc_found=False)
    assert missing.returncode == 1 and missing.stdout == ""
    assert "train.host_allocator=jemalloc" in missing.stderr and "train.host_allocator=auto" in missing.stderr


def test_user_fields_become_sbatch_options_and_a_cpu_partition_gets_no_gpus(monkeypatch, tmp_path):
    fields = {"account": "proj", "qos": "high", "constraint": "a100", "mem_gb": 16, "cpus_per_task": 4}
    params = sbatch_parameters({**LAUNCHER, **fields}, Placement(1, 2, None), ROOT)
    script = _batch_script(monkeypatch, tmp_path / "%j", params)
    options = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")]
    for option in ("--account=proj", "--qos=high", "--constraint=a100", "--mem=16G", "--cpus-per-task=4"):
        assert option in options
    assert "--time=60" in options and "--ntasks-per-node=2" in options
    assert not any("gpus" in option for option in options)


# --- one SLURM task = one rank: 2 nodes x 8 tasks, faked ---------------------------------------


def _task_env(procid: int) -> dict[str, str]:
    """What SLURM exports to task ``procid`` of a 2-node, 8-tasks-per-node job (srun(1))."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % 8),
        "SLURM_NTASKS": "16",
        "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu-[017-018]",
        "SLURM_JOB_PARTITION": "gpu",
    }


def test_each_task_of_a_two_node_job_is_one_rank_with_the_same_master():
    placement = place(gpus=16, per_node=8, on_gpus=True, what="GPUs")
    assert (placement.nodes, placement.tasks_per_node) == (2, 8)
    envs = [from_environment(_task_env(procid)) for procid in range(16)]
    assert all(env is not None and env.source == "slurm" for env in envs)
    assert sorted(env.rank for env in envs if env) == list(range(16))
    assert [env.local_rank for env in envs if env] == [r % 8 for r in range(16)]
    assert {(env.world_size, env.local_world_size) for env in envs if env} == {(16, 8)}
    # Every task derives the same rendezvous without talking: the first node, a port from the job id.
    assert {(env.master_addr, env.master_port) for env in envs if env} == {("gpu-017", slurm_port("4242"))}
    assert 15000 <= slurm_port("4242") < 32768  # below Linux's ephemeral ports
    exports = envs[9].exports() if envs[9] else {}
    assert (exports["RANK"], exports["LOCAL_RANK"], exports["WORLD_SIZE"]) == ("9", "1", "16")


def test_a_requeued_jobs_tasks_meet_on_another_port_than_its_run_before():
    """A requeued job keeps its id; the run before may still hold its port while its ranks exit."""
    ports = []
    for restarts in range(3):
        run = {"SLURM_RESTART_COUNT": str(restarts)}
        envs = [from_environment({**_task_env(procid), **run}) for procid in (0, 9)]
        assert envs[0] is not None and envs[1] is not None
        assert envs[0].master_port == envs[1].master_port  # still derived alike by every task
        ports.append(envs[0].master_port)
    assert ports[0] == slurm_port("4242")
    assert len(set(ports)) == 3 and all(15000 <= port < 32768 for port in ports), ports


def test_jobs_submitted_around_the_same_time_meet_on_ports_of_their_own():
    """Two jobs on one node that shared a port would meet at each other's rendezvous."""
    assert slurm_port("4242") != slurm_port("14242")  # once the same: the port came from the last 4 digits
    ports = {slurm_port(str(job_id)) for job_id in range(981_000, 981_000 + 17_768)}
    assert len(ports) == 17_768 and min(ports) == 15000 and max(ports) == 32767


def test_summary_records_the_job_nodes_and_tasks():
    record = slurm_job_record(_task_env(0))
    assert record is not None
    assert (record["job_id"], record["nodes"], record["tasks"], record["tasks_per_node"]) == (
        "4242",
        2,
        16,
        8,
    )
    assert slurm_job_record({}) is None


# --- pending forever --------------------------------------------------------------------------


def test_pending_reasons_that_never_clear_are_told_apart_from_waiting():
    for reason in ("BadConstraints", "PartitionNodeLimit", "QOSMaxNodePerJobLimit", "AssocMaxGRESPerJob"):
        assert never_starts(reason), reason
    for reason in ("Priority", "Resources", "QOSMaxJobsPerUserLimit", "BeginTime", "Dependency"):
        assert not never_starts(reason), reason


def test_stuck_jobs_reads_squeue(monkeypatch, tmp_path):
    squeue = tmp_path / "squeue"
    squeue.write_text(
        "#!/bin/bash\nprintf '7_0|PENDING|PartitionTimeLimit\\n7_1|PENDING|Priority\\n8|RUNNING|None\\n'\n"
    )
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert stuck_jobs(["7_0", "7_1", "8"]) == {"7_0": "PartitionTimeLimit"}


# --- the Hydra side: hydra/launcher=slurm composes, and each cell is planned from its config -----


def _compose(overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_launcher_config_composes_with_user_fields_and_no_derived_ones():
    cfg = _compose(["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.qos=high"])
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.ladder_slurm.launcher.LadderSlurmLauncher"
    assert (launcher.partition, launcher.qos, launcher.timeout_min) == ("gpu", "high", 60)
    with pytest.raises(ConfigCompositionException):
        _compose(["hydra/launcher=slurm", "hydra.launcher.nodes=2"])  # derived from gpus, per cell


def test_plan_cell_places_a_composed_cell_and_collects_every_problem():
    good = _compose(["hydra/launcher=slurm", "cluster=a100_80g", "gpus=16", "hydra.launcher.partition=gpu"])
    cell, problems = plan_cell(0, ["gpus=16"], good, {"gpu": GPU_NODES})
    assert problems == []
    assert cell is not None and cell.placement == Placement(2, 8, 8)
    assert (cell.params["nodes"], cell.params["ntasks_per_node"], cell.params["gpus_per_node"]) == (2, 8, 8)
    assert cell.run_dir.name == "0"

    bad = _compose(["hydra/launcher=slurm", "cluster=a100_80g", "gpus=9", "batch.global_size=72"])
    cell, problems = plan_cell(3, ["gpus=9"], bad, {None: CPU_NODE})
    assert cell is None
    assert any("try gpus=8 or gpus=10" in p for p in problems)
    assert any("cluster=a100_80g has gpus_per_node=8" in p for p in problems)


def test_a_sweep_logging_online_without_a_wandb_key_is_refused_on_the_login_node(monkeypatch, tmp_path):
    """The cells' ranks would each fail at wandb.init on the compute nodes; the submission refuses first."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    sweep = ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "cluster=a100_80g", "gpus=8"]
    online = _compose([*sweep, "logger=wandb", "logger.mode=online"])
    cell, problems = plan_cell(0, ["gpus=8"], online, {"gpu": GPU_NODES})
    assert cell is None
    assert any(p.startswith("logger.mode=online: wandb has no API key") for p in problems), problems
