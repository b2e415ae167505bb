"""summary.json: one typed schema, one writer per phase, strict JSON (what a browser, jq or the
report reads without special cases), and a malformed one refused naming the file and the key."""

from __future__ import annotations

import dataclasses
import errno
import json
import tempfile
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from runner.rundir.outcome import (
    attempt_status,
    prelaunch_status,
    record_failed,
    record_failed_if_running,
    record_interrupted,
    record_rank_cause,
)
from runner.rundir.summary import (
    SCHEMA_VERSION,
    AttemptEnd,
    Outcome,
    Prelaunch,
    RunStatus,
    RunSummary,
    SummaryError,
    load_summary,
    parse_summary,
    read_summary,
    write_attempt_end,
    write_lost_node,
    write_outcome,
    write_prelaunch,
)

pytestmark = pytest.mark.unit


LAYOUT = {"gpus": 2, "dp": 2, "tp": 1, "pp": 1, "micro_size": 4, "accum_steps": 2, "global_size": 16}


def _prelaunch(**changed: Any) -> Prelaunch:
    """What launchers/run_record.py records for a two-rank ddp run."""
    record = Prelaunch(
        outcome=prelaunch_status(),
        name="parallel=ddp,gpus=2",
        group=None,
        experiment=None,
        model="tiny",
        parallel="ddp",
        zero_stage=0,
        precision="fp32",
        launcher="local",
        layout=LAYOUT,
        num_params=52_000,
        lr=3e-4,
        slurm=None,
        layout_history=[{"from_step": 0, "parallel": "ddp", "zero_stage": 0, **LAYOUT}],
        tokenizer=None,
        micro_size_choice=None,
        plan_warnings=[],
        host_memory={"planned_per_rank_gb": 1.2, "planned_phase": "step", "ranks_per_node": 2},
        device_memory_plan={"planned_peak_gb": 0.4, "fits": True},
        step_time={"predicted_s": 0.4, "predicted_is_lower_bound": False},
        checkpoint_disk={"peak_bytes_to_write": 0, "fits": None},
    )
    return dataclasses.replace(record, **changed)


def _attempt_end(**changed: Any) -> AttemptEnd:
    """What runner/train/attempt_end.py records at the end of a completed 8-step attempt."""
    record = AttemptEnd(
        outcome=attempt_status(RunStatus.completed),
        interruptions=None,
        steps_completed=8,
        final={"loss": 3.2, "throughput/mfu": 0.4, "memory/peak_gb": 0.7},
        step_time_spread={"iqr_over_median": 0.04, "noisy": False, "steps": 7},
        step_time={"predicted_s": 0.4, "measured_s": 0.5, "measured_steps": 7, "error": -0.2},
        peak_flops_per_device=1.5e11,
        peak_flops_source="measured: matmul calibration",
        peak_flops_calibration=None,
        peak_memory_measure="process high-water RSS (the CPU device: the host's memory)",
        cuda_allocator=None,
        host_memory={"planned_per_rank_gb": 1.2, "measured_per_rank_gb": 1.1},
        memory={"unit": "GB (1e9 bytes)", "estimated": {"params_gb": 0.1}},
        accelerator="cpu",
        model_build={"rank": 0, "seconds": 0.3},
        compile=None,
        noise_scale={"simple": None, "unmeasured": "too few steps"},
        comm_exposed={"seconds_per_step": 0.01, "unmeasured": None},
        pipeline=None,
        skipped_steps={"policy": "raise", "count": 0, "steps": []},
        fp16_loss_scale=None,
        resumed_from_step=None,
        profile=None,
        wall_time={"total_s": 9.0, "steps_s": 6.0, "steps_share": 0.67},
        eval=None,
        goodput=None,
    )
    return dataclasses.replace(record, **changed)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def test_non_finite_numbers_are_written_as_null(tmp_path: Path) -> None:
    write_attempt_end(tmp_path, _attempt_end(final={"loss": 2.5, "batch/noise_scale": float("nan")}))
    write_lost_node(tmp_path, node="gpu-018", ranks=(1, 2))
    text = (tmp_path / "summary.json").read_text()
    data = json.loads(text, parse_constant=_refuse_constant)  # NaN / Infinity would raise here
    assert data["final"] == {"loss": 2.5, "batch/noise_scale": None}
    assert read_summary(tmp_path)["final"]["loss"] == 2.5


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """No new file can be made (what a full filesystem does to the temporary file beside summary.json)."""

    def no_room(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", no_room)


def test_a_full_disk_still_records_the_run_end_over_the_old_summary(tmp_path: Path, full_disk: None) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"status": "running", "layout": {"dp": 2}}, indent=2))
    record_failed(tmp_path, error="OSError: no room")
    assert read_summary(tmp_path) == {"status": "failed", "layout": {"dp": 2}, "error": "OSError: no room"}


def test_what_does_not_fit_over_the_old_summary_is_cut_to_the_status(tmp_path: Path, full_disk: None) -> None:
    running = {"status": "running", "steps_completed": 3}
    (tmp_path / "summary.json").write_text(json.dumps(running, indent=2) + " " * 200)
    failed = attempt_status(RunStatus.failed, "OSError: no room")
    write_attempt_end(tmp_path, _attempt_end(outcome=failed, final={"loss": list(range(3000))}))
    written = read_summary(tmp_path)
    assert written["status"] == "failed" and written["error"] == "OSError: no room"
    assert "final" not in written
    assert written["summary_cut"].startswith("the filesystem was full")
    loaded = load_summary(tmp_path)  # the compact record reads through the schema too
    assert loaded is not None and loaded.summary_cut == written["summary_cut"]


def test_a_full_disk_with_no_old_summary_raises(tmp_path: Path, full_disk: None) -> None:
    with pytest.raises(OSError, match="No space left"):
        write_outcome(tmp_path, Outcome(status=RunStatus.failed))


def test_every_phase_writes_keys_of_the_schema_with_its_types() -> None:
    """A phase's record names no key the schema lacks, nor gives one another type."""
    schema = get_type_hints(RunSummary)
    for phase in (Prelaunch, AttemptEnd):
        for name, hint in get_type_hints(phase).items():
            if name != "outcome":
                assert name in schema, f"{phase.__name__}.{name} is not a key of RunSummary"
                assert hint | None == schema[name], f"{phase.__name__}.{name}: {hint} against {schema[name]}"
    for name, hint in get_type_hints(Outcome).items():
        assert hint | None == schema[name], name


def test_what_each_phase_writes_reads_back_typed(tmp_path: Path) -> None:
    write_prelaunch(tmp_path, _prelaunch(micro_size_choice="the largest that fits: 4"))
    prelaunch = load_summary(tmp_path)
    assert prelaunch is not None
    assert (prelaunch.schema, prelaunch.status, prelaunch.error) == (SCHEMA_VERSION, "running", None)
    assert (prelaunch.layout, prelaunch.num_params, prelaunch.lr) == (LAYOUT, 52_000, 3e-4)
    assert prelaunch.micro_size_choice == "the largest that fits: 4" and prelaunch.tokenizer is None
    assert "tokenizer" not in read_summary(tmp_path)  # absent without data.tokenizer, as before

    stopped = {"signal": "SIGTERM", "reason": "stopped by SIGTERM", "step": 4}
    interrupted = attempt_status(RunStatus.interrupted, "stopped by SIGTERM")
    returned = write_attempt_end(tmp_path, _attempt_end(outcome=interrupted, interruptions=[stopped]))
    assert returned == read_summary(tmp_path)
    end = load_summary(tmp_path)
    assert end is not None
    assert (end.status, end.steps_completed, end.interruptions) == ("interrupted", 8, [stopped])
    assert end.wall_time == {"total_s": 9.0, "steps_s": 6.0, "steps_share": 0.67}
    assert end.name == "parallel=ddp,gpus=2"  # prelaunch's keys stay
    write_attempt_end(tmp_path, _attempt_end(outcome=None))  # another rank recorded a failure first
    assert load_summary(tmp_path) == end  # its outcome and its interruptions stay

    write_lost_node(tmp_path, node="gpu-018", ranks=(1, 2))
    record_failed(tmp_path, error="DistNetworkError: Connection closed by peer", failed_rank=0)
    failed = load_summary(tmp_path)
    assert failed is not None
    assert (failed.lost_node, failed.lost_ranks) == ("gpu-018", [1, 2])
    assert (failed.status, failed.failed_rank) == ("failed", 0)
    assert failed.unknown == {}
    assert parse_summary(failed.to_dict(), tmp_path / "summary.json") == failed


def test_older_summaries_read_and_are_upgraded(tmp_path: Path) -> None:
    """Version 0 (no ``schema`` key) holds the same keys as version 1; a key this ladder does not
    know is kept as read, and a rewrite keeps the old version and that key."""
    old = {"status": "completed", "error": None, "steps_completed": 8, "final": {"loss": 3.2}, "note": "x"}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    loaded = load_summary(tmp_path)
    assert loaded is not None
    assert (loaded.schema, loaded.status, loaded.steps_completed) == (SCHEMA_VERSION, "completed", 8)
    assert (loaded.final, loaded.unknown) == ({"loss": 3.2}, {"note": "x"})
    record_interrupted(tmp_path, words="stopped by SIGTERM")  # a resumed old run keeps its summary's version
    assert "schema" not in read_summary(tmp_path) and read_summary(tmp_path)["note"] == "x"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"status": "comp', "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"status": "done"}', "key 'status' is 'done'"),
        ('{"status": "failed", "failed_rank": "1"}', "key 'failed_rank' is '1', expected an integer rank"),
        ('{"layout": [2, 1, 1]}', "key 'layout' is [2, 1, 1], expected a JSON object or null"),
        ('{"lost_ranks": [1, "2"]}', "key 'lost_ranks' is [1, '2'], expected a list of integers or null"),
        ('{"lr": true}', "key 'lr' is True, expected a number or null"),
        ('{"schema": 99}', "upgrade ladder"),
    ],
)
def test_a_malformed_summary_is_refused_naming_the_file_and_key(
    tmp_path: Path, text: str, words: str
) -> None:
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(SummaryError) as refused:
        load_summary(tmp_path)
    assert str(tmp_path / "summary.json") in str(refused.value)
    assert words in str(refused.value)


def test_the_first_failure_recorded_stays_the_cause(tmp_path: Path) -> None:
    write_outcome(tmp_path, prelaunch_status())
    record_rank_cause(tmp_path, rank=1, words="RuntimeError: CUDA out of memory")
    record_rank_cause(tmp_path, rank=2, words="DistBackendError: Connection closed by peer")
    record_failed_if_running(tmp_path, error="job 7 ended FAILED")  # the scheduler's verdict comes last
    summary = read_summary(tmp_path)
    assert (summary["status"], summary["failed_rank"]) == ("failed", 1)
    assert summary["error"] == "RuntimeError: CUDA out of memory"
    record_interrupted(tmp_path, words="stopped by SIGTERM")
    assert read_summary(tmp_path)["status"] == "interrupted"
