"""``ladder export``'s refusal when the checkpoint cannot be converted to the universal format:
the conversion's own words, once, without a traceback (runner/checkpoint/hf_export.py)."""

from __future__ import annotations

import subprocess

import pytest

from runner.checkpoint import hf_export, universal_conversion

pytestmark = pytest.mark.unit

REFUSAL = (
    "ladder export: DeepSpeed's ds_to_universal could not convert step_00000004 to the universal format: "
    "ValueError: Rank 0 supplied a shard of 256 elements (the universal copy goes beside the checkpoint). "
    "Export another checkpoint with --step N, or free room beside it"
)


def test_the_conversion_child_prints_its_refusal_alone_and_fails(monkeypatch, capsys, tmp_path):
    def refuse(*_args, **_kwargs):
        raise ValueError(REFUSAL)

    monkeypatch.setattr(universal_conversion, "universal_copy", refuse)
    monkeypatch.setattr(hf_export, "model_config", lambda _run_dir: None)
    with pytest.raises(SystemExit) as exited:
        hf_export._convert_main([str(tmp_path), '{"tag": "step_00000004"}'])
    assert exited.value.code == 1
    assert capsys.readouterr().err == REFUSAL + "\n"  # no traceback above it


def test_the_refusal_names_the_command_once(monkeypatch, tmp_path):
    failed = subprocess.CompletedProcess(args=[], returncode=1, stdout="", stderr=REFUSAL + "\n")
    monkeypatch.setattr(hf_export.subprocess, "run", lambda *_args, **_kwargs: failed)
    with pytest.raises(hf_export.ExportError) as refused:
        hf_export._convert_in_child(tmp_path, {"tag": "step_00000004"})
    message = str(refused.value)
    assert "ladder export" not in message  # the CLI puts it in front, once
    assert message.startswith("step_00000004: the conversion to the universal format failed: DeepSpeed's")
    assert "--step N" in message
