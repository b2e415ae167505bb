"""A build lock left by a killed run no longer makes the next run wait for ever.

The lock is torch's own (``torch.utils.file_baton.FileBaton``, as DeepSpeed's op builds
take it), held by a real child process that is then killed, as a run stopped mid-build is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.utils.file_baton import FileBaton

from runner.preflight import build_locks
from runner.preflight.build_locks import (
    STALE_AFTER_S,
    clear_stale_build_locks,
    filesystem_type,
    find_build_locks,
    processes_holding,
)

pytestmark = pytest.mark.unit

_HOLD_BATON = """
import sys, time
from torch.utils.file_baton import FileBaton
baton = FileBaton(sys.argv[1])
assert baton.try_acquire()
print("building", flush=True)
time.sleep(120)
"""


def _lock_path(root: Path, op: str) -> Path:
    folder = root / "py311_cpu" / op
    folder.mkdir(parents=True)
    return folder / "lock"


def _age(lock: Path, age_s: float) -> None:
    stamp = time.time() - age_s
    os.utime(lock, (stamp, stamp))


@pytest.fixture
def filesystem(monkeypatch):
    """Pretend the locks lie on a filesystem of the given type."""

    def set_type(kind: str) -> None:
        monkeypatch.setattr(build_locks, "filesystem_type", lambda path: kind)

    return set_type


@pytest.fixture
def builder(tmp_path):
    """A child process that takes a build lock the way torch's extension builds do."""
    started = []

    def start(lock: Path) -> subprocess.Popen:
        command = [sys.executable, "-c", _HOLD_BATON, str(lock)]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "building"
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()
        child.wait()


def test_a_build_in_progress_keeps_its_lock_and_a_killed_one_loses_it(tmp_path, filesystem, builder):
    filesystem("ext4")
    lock = _lock_path(tmp_path, "deepspeed_shm_comm")
    child = builder(lock)

    (found,) = find_build_locks(tmp_path)
    assert found.holders == (child.pid,)
    assert clear_stale_build_locks(tmp_path) == []  # young and held: quiet
    _age(lock, STALE_AFTER_S + 60)
    (line,) = clear_stale_build_locks(tmp_path)
    assert lock.exists() and f"pid {child.pid}" in line and "still building" in line

    child.send_signal(signal.SIGKILL)  # a run killed mid-build: the file stays, nobody holds it
    child.wait()
    assert lock.exists()
    (line,) = clear_stale_build_locks(tmp_path)
    assert line.startswith(f"removed {lock}")
    assert FileBaton(str(lock)).try_acquire()  # the next build goes ahead


def test_a_young_unheld_lock_on_a_shared_filesystem_may_be_another_nodes_build(tmp_path, filesystem):
    filesystem("nfs4")
    lock = _lock_path(tmp_path, "cpu_adam")
    lock.touch()

    (line,) = clear_stale_build_locks(tmp_path)
    assert lock.exists()
    assert "nfs4" in line and "another node" in line and f"rm {lock}" in line

    _age(lock, STALE_AFTER_S + 60)  # older than any build: nobody is behind it
    (line,) = clear_stale_build_locks(tmp_path)
    assert line.startswith(f"removed {lock}") and not lock.exists()


def test_without_proc_only_an_old_lock_is_named_and_none_is_removed(tmp_path, filesystem, monkeypatch):
    filesystem("ext4")
    monkeypatch.setattr(build_locks, "processes_holding", lambda path: None)
    young = _lock_path(tmp_path, "cpu_adam")
    young.touch()
    old = _lock_path(tmp_path, "deepspeed_shm_comm")
    old.touch()
    _age(old, STALE_AFTER_S + 60)

    (line,) = clear_stale_build_locks(tmp_path)
    assert young.exists() and old.exists()
    assert "deepspeed_shm_comm" in line and f"rm {old}" in line


def test_holders_are_found_through_proc(tmp_path):
    lock = tmp_path / "lock"
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)
    try:
        assert os.getpid() in (processes_holding(lock) or ())
    finally:
        os.close(fd)
    assert os.getpid() not in (processes_holding(lock) or ())
    assert processes_holding(lock, proc=tmp_path / "no-proc") is None


def test_the_filesystem_is_the_longest_mount_point_holding_the_path(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "overlay / overlay rw 0 0\n"
        "server:/home /home nfs4 rw 0 0\n"
        "/dev/sda1 /home/me/fast\\040disk ext4 rw 0 0\n"
    )
    assert filesystem_type(Path("/home/me/.cache/torch_extensions"), mounts) == "nfs4"
    assert filesystem_type(Path("/home/me/fast disk/cache"), mounts) == "ext4"
    assert filesystem_type(Path("/homework"), mounts) == "overlay"  # /home is not a prefix of it
    assert filesystem_type(Path("/tmp"), tmp_path / "absent") == ""


def test_no_extensions_folder_means_nothing_to_do(tmp_path):
    assert clear_stale_build_locks(tmp_path / "absent") == []
