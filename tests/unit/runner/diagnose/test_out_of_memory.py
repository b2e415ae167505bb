"""A rank out of memory is told apart from other failures and says where, with the plan's terms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from train_helpers import compose_config

from runner.diagnose.out_of_memory import explain, is_out_of_memory, last_measured, out_of_memory_words
from runner.plan.planner import knobs_from_config, plan_layout, workload_from_config
from runner.rundir.run_files import with_notes

pytestmark = pytest.mark.unit


def _plan(*overrides: str):
    config = compose_config(*overrides)
    return config, plan_layout(workload_from_config(config, with_peak=False), knobs_from_config(config))


def test_the_allocators_refusals_are_out_of_memory_and_other_errors_are_not():
    with pytest.raises(RuntimeError) as refused:
        torch.empty(2**62, dtype=torch.uint8)  # the host allocator's real refusal: 4 EiB
    assert is_out_of_memory(refused.value)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("Connection closed by peer"))
    assert not is_out_of_memory(ValueError("can't allocate memory"))  # only the allocator's RuntimeError


def test_the_words_name_the_step_the_terms_the_measured_peak_and_the_fixes():
    _, plan = _plan(
        "model=llama_1b",
        "cluster=h100_sxm",
        "precision=bf16",
        "gpus=8",
        "batch.global_size=64",
        "batch.micro_size=4",
    )
    words = out_of_memory_words(plan, (41, 52.5))
    assert words.startswith("out of memory after step 41: the plan puts ")
    assert f"{plan.memory.activations / 1e9:.2f} GB at micro 4" in words
    assert "step 41 measured a peak of 52.50 GB" in words
    assert "planner.recommend=true" in words
    assert "model.activation_checkpointing=full or a smaller batch.micro_size" in words
    assert "the plan said it fits" in words if plan.fits else "the plan had warned" in words
    # Nothing measured yet: before the first step ended.
    assert "before its first step ended" in out_of_memory_words(plan, None)


def test_a_layout_the_plan_said_would_not_fit_is_told_so():
    _, plan = _plan("model=llama_7b", "cluster=h100_sxm", "precision=bf16", "gpus=1", "batch.micro_size=8")
    assert not plan.fits
    assert "the plan had warned that it would not fit" in out_of_memory_words(plan, None)


def test_the_note_goes_on_the_error_and_into_its_record(tmp_path: Path):
    config, _ = _plan("batch.micro_size=4", "logger=none")
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "loss": 5.1, "memory/peak_gb": 0.21})
        + "\n"
        + json.dumps({"step": 1, "loss": 5.0, "memory/peak_gb": 0.25})
        + '\n{"step": 2, "lo'  # a line cut short by a killed attempt
    )
    assert last_measured(tmp_path) == (1, 0.25)
    error = torch.OutOfMemoryError("CUDA out of memory")
    explain(error, config, tmp_path)
    record = with_notes(error)
    assert record.startswith("OutOfMemoryError: CUDA out of memory; out of memory after step 1: ")
    other = RuntimeError("Connection closed by peer")
    explain(other, config, tmp_path)
    assert with_notes(other) == "RuntimeError: Connection closed by peer"
