"""A CPU run's MFU is over the calibration kept for this machine; a run above it calibrates anew."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

RUN = ("train.steps=2", "logger=none", "data=synthetic")


def test_a_run_faster_than_the_kept_peak_says_so_and_the_next_run_calibrates_again(train, tmp_path):
    env = {"LADDER_CACHE_DIR": str(tmp_path / "cache")}
    first = train(*RUN, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    cache_file = tmp_path / "cache" / "cpu_peak.json"
    cache = json.loads(cache_file.read_text())
    # As if the calibration had run on cores other processes held throughout: 1 MFLOP/s, kept for good.
    for entry in cache["peaks"].values():
        entry.update(flops=1e6, settled=True, busy=False)
    cache_file.write_text(json.dumps(cache))
    slow = train(*RUN, env=env)
    assert slow.returncode == 0, slow.stderr[-3000:]
    assert slow.summary["peak_flops_per_device"] == 1e6
    assert "80th percentile of 9 matmul rounds" in slow.summary["peak_flops_source"]
    calibration = slow.summary["peak_flops_calibration"]
    assert calibration["ranks"] == 1 and calibration["threads_in_all"] == calibration["threads_per_rank"]
    said = (slow.run_dir / "train.log").read_text() + slow.stdout + slow.stderr
    assert "is above 1: this CPU did more than the peak calibrated earlier" in said
    kept = json.loads(cache_file.read_text())["peaks"]
    assert any(not entry["settled"] for entry in kept.values()), kept  # the rank's key: measured again
    again = train(*RUN, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.summary["peak_flops_per_device"] > 1e8  # measured again, not the 1 MFLOP/s kept
    if again.summary["final"]["throughput/mfu"] >= 1:
        # The new calibration ran while another process (the suite's other worker) held a core,
        # and the run then had the cores to itself (measured once: MFU 1.17). The code guarantees
        # no MFU below 1 then, only that the run says so again and leaves the key to measure anew.
        said = (again.run_dir / "train.log").read_text() + again.stdout + again.stderr
        assert "is above 1: this CPU did more than the peak calibrated earlier" in said
        kept = json.loads(cache_file.read_text())["peaks"]
        assert any(not entry["settled"] for entry in kept.values()), kept
