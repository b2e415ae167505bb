"""wandb's end does not end the run: its sink says once what wandb missed and goes quiet."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from train_helpers import ROOT

pytestmark = pytest.mark.unit

# In a process of its own: the killed wandb service would stay this process's service.
SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from pathlib import Path

    import psutil

    from runner.config import LoggerConfig, WandbMode
    from runner.metrics.sinks import WandbSink

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    logger = LoggerConfig(name="wandb", mode=WandbMode.offline, project="p", entity=None,
                          base_url=None, log_every=1, progress=False)
    sink = WandbSink(logger, run_dir=Path(sys.argv[1]), name="n", group=None, config={}, run_id="r1")
    sink.log(0, {"loss": 1.0})
    for child in psutil.Process().children(recursive=True):  # wandb's service, as a launcher's kill would
        child.kill()
    psutil.wait_procs(psutil.Process().children(recursive=True), timeout=10)
    sink.log(1, {"loss": 0.9})
    sink.log(2, {"loss": 0.8})
    sink.close({"status": "interrupted", "steps_completed": 3})
    print("closed")
    """
)


def test_a_killed_wandb_service_is_reported_once_and_the_run_goes_on(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("closed")
    warnings = [line for line in done.stderr.splitlines() if "wandb stopped taking metrics" in line]
    assert len(warnings) == 1, done.stderr[-3000:]
    assert "at step 1 " in warnings[0] and "metrics.jsonl and summary.json hold the whole run" in warnings[0]
