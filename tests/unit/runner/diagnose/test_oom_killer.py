"""A rank's SIGKILL is told apart: the kernel's out-of-memory killer (its counts, its log) or not;
and a rank whose peer's process ended says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import compose_config

from runner.diagnose.oom_killer import OomCounts, kernel_log, killed_line, killer_verdict, read_counts
from runner.diagnose.out_of_memory import killed_words
from runner.diagnose.peer_loss import explain, is_peer_lost, peer_lost_words
from runner.plan.planner import knobs_from_config, plan_layout, workload_from_config
from runner.rundir.run_files import with_notes

pytestmark = pytest.mark.unit

MEMCG_LINE = (
    "Memory cgroup out of memory: Killed process 23984 (python) total-vm:3336852kB, "
    "anon-rss:2406688kB, file-rss:6604kB, shmem-rss:0kB, UID:0 pgtables:860kB oom_score_adj:0"
)
HOST_LINE = "Out of memory: Killed process 4242 (python) total-vm:9000000kB, anon-rss:8000000kB, file-rss:0kB"


def _proc(tmp_path: Path, *, vmstat_kills: int | None, cgroup_kills: int | None, v2: bool = True) -> Path:
    """A /proc whose process sits in a memory cgroup (v2 or v1) with those counts."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    hierarchy = tmp_path / "cgroup"
    folder = hierarchy / "job_7" / "step_0"
    folder.mkdir(parents=True)
    if v2:
        mount = f"30 25 0:26 / {hierarchy} rw - cgroup2 cgroup2 rw\n"
        (proc / "self" / "cgroup").write_text("0::/job_7/step_0\n")
        events = folder / "memory.events"
        counts = "low 0\nhigh 0\nmax 3\noom {n}\noom_kill {n}\n"
    else:
        mount = f"30 25 0:26 / {hierarchy} rw - cgroup cgroup rw,memory\n"
        (proc / "self" / "cgroup").write_text("4:memory:/job_7/step_0\n")
        events = folder / "memory.oom_control"
        counts = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"
    (proc / "self" / "mountinfo").write_text(mount)
    if cgroup_kills is not None:
        events.write_text(counts.format(n=cgroup_kills))
    if vmstat_kills is not None:
        (proc / "vmstat").write_text(f"nr_free_pages 100\noom_kill {vmstat_kills}\nnr_zone 3\n")
    return proc


@pytest.mark.parametrize("v2", [True, False])
def test_the_counts_are_read_from_the_host_and_the_processs_memory_cgroup(tmp_path: Path, v2: bool):
    proc = _proc(tmp_path, vmstat_kills=5, cgroup_kills=2, v2=v2)
    counts = read_counts(proc)
    assert (counts.host, counts.cgroup) == (5, 2)
    assert counts.cgroup_dir == tmp_path / "cgroup" / "job_7" / "step_0"


def test_a_kill_the_kernel_log_names_says_which_memory_ran_out(tmp_path: Path):
    proc = _proc(tmp_path, vmstat_kills=1, cgroup_kills=1)
    before = OomCounts(host=0, cgroup=0, cgroup_dir=None)
    log = f"a line\n{HOST_LINE}\n{MEMCG_LINE}\n"
    verdict = killer_verdict(before, 23984, log=log, proc=proc)
    assert verdict is not None and verdict.by_oom_killer
    assert verdict.words.startswith(
        "the kernel's out-of-memory killer ended it, its memory cgroup's cap spent, at 2.46 GB resident"
    )
    assert "(kernel log: Memory cgroup out of memory: Killed process 23984 (python)" in verdict.words
    host = killer_verdict(before, 4242, log=log, proc=proc)
    assert host is not None and "this host's memory spent, at 8.19 GB resident" in host.words


def test_a_kill_the_log_does_not_name_is_told_by_the_counts_that_rose(tmp_path: Path):
    """The rank's pid is not in the log (a container's pid namespace, or no right to read it)."""
    proc = _proc(tmp_path, vmstat_kills=4, cgroup_kills=3)
    verdict = killer_verdict(OomCounts(host=3, cgroup=2, cgroup_dir=Path("/g")), 99, log="", proc=proc)
    assert verdict is not None and verdict.by_oom_killer
    assert verdict.words == (
        "the kernel's out-of-memory killer was at work while it ran: 1 in the run's memory cgroup (/g) "
        "and 1 on this host (/proc/vmstat oom_kill)"
    )


def test_counts_that_stayed_put_say_another_process_sent_the_signal(tmp_path: Path):
    proc = _proc(tmp_path, vmstat_kills=4, cgroup_kills=None)
    verdict = killer_verdict(OomCounts(host=4, cgroup=None, cgroup_dir=None), 99, log="", proc=proc)
    assert verdict is not None and not verdict.by_oom_killer
    assert "another process sent it" in verdict.words


def test_no_counts_and_no_log_tell_nothing(tmp_path: Path):
    proc = _proc(tmp_path, vmstat_kills=None, cgroup_kills=None)
    assert killer_verdict(OomCounts(host=None, cgroup=None, cgroup_dir=None), 99, log="", proc=proc) is None


def test_the_last_kill_of_a_pid_is_the_one_read():
    again = MEMCG_LINE.replace("anon-rss:2406688kB", "anon-rss:1000kB")
    match = killed_line(23984, f"{MEMCG_LINE}\n{again}\n")
    assert match is not None and match["anon_kb"] == "1000"
    assert killed_line(1, MEMCG_LINE) is None


def test_the_kernel_log_is_read_whole_or_not_at_all(tmp_path: Path):
    """/dev/kmsg where this user may read it (its records without their prefix), else nothing."""
    assert kernel_log(tmp_path / "no-such-device") == ""
    log = kernel_log()
    assert ";" not in log.split("\n", 1)[0][:12]  # "6,1234,5678,-;" prefixes are cut off


def test_after_a_kill_the_words_put_the_plans_host_memory_beside_the_measured_peak(no_cpu_calibration):
    config = compose_config("gpus=2", "batch.micro_size=4")
    plan = plan_layout(workload_from_config(config, with_peak=False), knobs_from_config(config))
    words = killed_words(plan, (12, 0.64))
    assert words.startswith("the plan: host FITS, ")
    assert "2 ranks x " in words and "step 12 measured a peak of 0.64 GB on rank 0" in words
    assert "the plan said it fits, so the memory went to what the plan does not count" in words
    assert "model.activation_checkpointing=full or a smaller batch.micro_size" in words  # CPU ranks
    assert "before its first step ended" in killed_words(plan, None)


GLOO_LOST = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:20365. This is typically caused by a remote worker crashing."
)


def test_a_collective_that_lost_its_peer_is_told_from_other_errors():
    import torch.distributed as dist

    assert is_peer_lost(RuntimeError(GLOO_LOST))
    assert is_peer_lost(RuntimeError("NCCL error: remote process exited or there was a network error"))
    assert is_peer_lost(dist.DistNetworkError("The client socket has failed to connect"))
    assert not is_peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_the_note_says_another_rank_ended_first_and_what_the_kernel_counted(tmp_path: Path):
    proc = _proc(tmp_path, vmstat_kills=2, cgroup_kills=1)
    at_work = peer_lost_words(OomCounts(host=1, cgroup=1, cgroup_dir=None), proc)
    assert at_work.startswith("another rank's process ended first and this rank learned of it")
    killer = "the kernel's out-of-memory killer was at work while this rank ran"
    assert at_work.endswith(f"{killer}: 1 on this host (/proc/vmstat oom_kill)")
    idle = peer_lost_words(OomCounts(host=2, cgroup=1, cgroup_dir=None), proc)
    assert idle.endswith("the kernel's out-of-memory killer ended nothing on this host while this rank ran")


def test_the_note_goes_on_the_error_only_when_a_peer_was_lost():
    lost, other = RuntimeError(GLOO_LOST), ValueError("bad value")
    counts = OomCounts(host=None, cgroup=None, cgroup_dir=None)
    explain(lost, counts)
    explain(other, counts)
    assert with_notes(lost).startswith(f"RuntimeError: {GLOO_LOST}; another rank's process ended first")
    assert with_notes(other) == "ValueError: bad value"
