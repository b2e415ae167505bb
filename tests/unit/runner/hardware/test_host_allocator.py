"""train.host_allocator: which malloc a CPU rank runs with, the environment that gives it, and the
refusal where jemalloc is asked for but missing. Each branch is forced both ways, whatever this
host has installed."""

from __future__ import annotations

import re

import pytest

from runner.config import HostAllocator
from runner.hardware import host_allocator
from runner.hardware.host_allocator import (
    JEMALLOC_CONF,
    JEMALLOC_SONAME,
    allocator_problem,
    rank_allocator,
    running_allocator,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("choice", [HostAllocator.auto, HostAllocator.jemalloc])
def test_a_cpu_rank_gets_jemalloc_preloaded_before_the_users_own_preload(choice):
    allocator = rank_allocator(
        choice,
        cpu_rank=True,
        environ={"LD_PRELOAD": "libmine.so", "MALLOC_CONF": "narenas:2"},
        installed=True,
    )
    assert allocator.name == "jemalloc" and allocator.keeps_freed_memory
    assert allocator.env["LD_PRELOAD"] == f"{JEMALLOC_SONAME} libmine.so"
    assert allocator.env["MALLOC_CONF"] == f"{JEMALLOC_CONF},narenas:2"


@pytest.mark.parametrize(
    ("choice", "cpu_rank", "installed"),
    [
        (HostAllocator.auto, True, False),  # not installed: the C library's, no refusal
        (HostAllocator.auto, False, True),  # a GPU rank's large tensors are CUDA's
        (HostAllocator.system, True, True),
    ],
)
def test_otherwise_the_rank_keeps_the_c_librarys_malloc_and_its_environment(choice, cpu_rank, installed):
    allocator = rank_allocator(choice, cpu_rank=cpu_rank, environ={"LD_PRELOAD": "x.so"}, installed=installed)
    assert allocator.name == "system" and not allocator.keeps_freed_memory and not allocator.env


def test_asking_for_jemalloc_where_it_is_missing_is_refused_with_the_fix():
    problem = allocator_problem(HostAllocator.jemalloc, installed=False)
    assert problem is not None
    assert "train.host_allocator=jemalloc" in problem and "apt-get install libjemalloc2" in problem
    assert "train.host_allocator=auto" in problem
    assert allocator_problem(HostAllocator.jemalloc, installed=True) is None
    assert allocator_problem(HostAllocator.auto, installed=False) is None


def test_the_probe_agrees_with_what_a_preloaded_process_maps(tmp_path):
    """The launcher's probe and the rank's own report: a process started with the environment
    :func:`rank_allocator` gives maps libjemalloc exactly when the probe found it."""
    import subprocess
    import sys

    allocator = rank_allocator(HostAllocator.auto, cpu_rank=True, environ={})
    maps = subprocess.run(
        [sys.executable, "-c", "print(open('/proc/self/maps').read())"],
        env={**allocator.env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert running_allocator(maps) == ("jemalloc" if host_allocator.jemalloc_installed() else "system")


def test_the_local_launch_refuses_jemalloc_where_this_host_lacks_it(monkeypatch):
    from train_helpers import compose_config

    from runner.errors import ConfigError
    from runner.preflight.validate import validate

    monkeypatch.setattr(host_allocator, "jemalloc_installed", lambda: False)
    with pytest.raises(
        ConfigError, match=re.escape("train.host_allocator=jemalloc: libjemalloc.so.2 is not")
    ):
        validate(compose_config("train.host_allocator=jemalloc"), launcher="local")
    validate(compose_config("train.host_allocator=auto"), launcher="local")  # falls back, no refusal
