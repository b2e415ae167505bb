"""Exposed communication from a trace's kernels: collective time that no compute kernel covers."""

from __future__ import annotations

import json

import pytest

from runner.metrics.trace_overlap import device_comm, exposed, kernel_intervals, union

pytestmark = pytest.mark.unit


def test_union_merges_what_overlaps_or_touches():
    assert union([(5, 8), (0, 2), (1, 3), (8, 9), (12, 13)]) == [(0, 3), (5, 9), (12, 13)]


def test_only_the_collective_time_no_compute_covers_is_exposed():
    # A 10 us all-reduce on its own stream, two compute kernels beside it on another.
    assert exposed([(0, 10)], [(5, 8), (9, 20)]) == 6  # [0, 5) and [8, 9)
    assert exposed([(0, 10)], [(0, 10)]) == 0  # fully overlapped
    assert exposed([(0, 4), (2, 6)], []) == 6  # two collectives at once count once
    assert exposed([], [(0, 1)]) == 0


def _kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


EVENTS = [
    _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 100, 50),
    _kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 90, 30),
    _kernel("Memcpy DtoD (Device -> Device)", 120, 40, cat="gpu_memcpy"),  # neither
    {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 95, "dur": 5},  # the host's call
]


def test_kernels_are_read_from_the_chrome_trace(tmp_path):
    collectives, compute = kernel_intervals(EVENTS)
    assert collectives == [(100.0, 150.0)] and compute == [(90.0, 120.0)]
    trace = tmp_path / "rank0_step2.json"
    trace.write_text(json.dumps({"traceEvents": EVENTS}))
    assert device_comm(trace) == pytest.approx({"comm_kernels_s": 50e-6, "comm_exposed_s": 30e-6})
