"""Bad input is refused before any rank starts, naming the key, the value and the fix."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


CASES = [
    (
        ["batch.global_size=16", "batch.micro_size=3", "gpus=2"],
        ["batch.micro_size=3", "x dp 2", "{1, 2, 4, 8}"],
    ),
    (["parallel=zero9"], ["parallel", "zero9"]),
    (["gpus=0"], ["gpus=0", "at least 1"]),
    (["precision=fp16"], ["precision=fp16", "precision=bf16"]),
    (["train.steps=-1"], ["train.steps=-1", "at least 1"]),
    (["gpus=64"], ["gpus=64", "hydra/launcher=slurm", "plan=true"]),
    (["batch.micro_size=four"], ["batch.micro_size", "four", "auto"]),
    (["data.seq_len=4096"], ["data.seq_len=4096", "model.max_seq_len=1024"]),
    (["model.n_layr=2"], ["n_layr"]),
]


@pytest.mark.parametrize(("overrides", "fragments"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_refused_before_launch(train, tmp_path, overrides, fragments):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "summary.json").write_text('{"status": "completed"}')
    before = _tree_digest(earlier)
    result = train(*overrides, "logger=none", timeout=120)
    assert result.returncode != 0
    text = result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text[-2000:]}"
    assert "Traceback" not in result.stderr
    assert not (result.run_dir / "metrics.jsonl").exists()
    assert not (result.run_dir / "deepspeed_config.json").exists()
    assert _tree_digest(earlier) == before


def test_an_existing_run_directory_is_never_reused(train, tmp_path):
    held = tmp_path / "run0"
    held.mkdir()
    (held / "summary.json").write_text('{"status": "completed"}')
    before = _tree_digest(held)
    result = train("train.steps=1", timeout=120)
    assert result.returncode == 2
    assert "already holds a run" in result.stderr
    assert _tree_digest(held) == before
