"""A build lock left by a killed run is named before the ranks start, with the fix."""

from __future__ import annotations

import os
import time

import pytest

from runner.build_locks import STALE_AFTER_S, stale_build_locks, stale_lock_warnings

pytestmark = pytest.mark.unit


def _lock(root, op: str, age_s: float):
    lock = root / "py311_cpu" / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    stamp = time.time() - age_s
    os.utime(lock, (stamp, stamp))
    return lock


def test_only_locks_older_than_any_build_are_reported(tmp_path):
    old = _lock(tmp_path, "deepspeed_shm_comm", STALE_AFTER_S + 60)
    _lock(tmp_path, "cpu_adam", 5)  # a build in progress
    (tmp_path / "py311_cpu" / "fused_adam").mkdir()  # built, no lock

    assert stale_build_locks(tmp_path) == [old]
    (warning,) = stale_lock_warnings(tmp_path)
    assert "deepspeed_shm_comm" in warning
    assert f"rm {old}" in warning


def test_no_extensions_folder_means_no_warning(tmp_path):
    assert stale_build_locks(tmp_path / "absent") == []
