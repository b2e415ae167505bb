"""A CPU run's MFU is over the best calibration kept for this CPU; a run above it calibrates anew."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

RUN = ("train.steps=2", "logger=none", "data=synthetic")


def test_a_run_faster_than_the_kept_peak_says_so_and_the_next_runs_calibrate_again(train, tmp_path):
    env = {"LADDER_CACHE_DIR": str(tmp_path / "cache")}
    first = train(*RUN, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    cache_file = tmp_path / "cache" / "cpu_peak.json"
    cache = json.loads(cache_file.read_text())
    keys = [key for key in cache if key != "calibrations"]
    # As if every calibration so far had run on cores other processes held: 1 MFLOP/s, kept.
    cache_file.write_text(json.dumps({**dict.fromkeys(keys, 1e6), "calibrations": dict.fromkeys(keys, 3)}))
    slow = train(*RUN, env=env)
    assert slow.returncode == 0, slow.stderr[-3000:]
    assert slow.summary["peak_flops_per_device"] == 1e6
    assert "best of 3 matmul calibrations" in slow.summary["peak_flops_source"]
    said = (slow.run_dir / "train.log").read_text() + slow.stdout + slow.stderr
    assert "is above 1: this CPU did more than the peak calibrated earlier" in said
    counts = json.loads(cache_file.read_text())["calibrations"]
    assert 0 in counts.values(), counts  # the rank's key: its next run measures again
    again = train(*RUN, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.summary["peak_flops_per_device"] > 1e9
    assert again.summary["final"]["throughput/mfu"] < 1
