"""A run whose optimizer keeps no state (SGD without momentum, constant rate) trained under ZeRO-3
on 2 ranks exports from a mid-run checkpoint, and a ddp run from the export, reading on from the
run's data position, continues its losses: such an optimizer's state is the weights alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import FP32_TOLERANCE, ROOT, clean_env, run_train

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.multirank, pytest.mark.hf]

SEQ_LEN, GLOBAL, STEPS, EXPORTED = 32, 4, 4, 2
STATELESS_SGD = [
    "optimizer=sgd",
    "optimizer.momentum=0",
    "optimizer.warmup_steps=0",
    "optimizer.schedule=constant",
]
COMMON = [
    *STATELESS_SGD,
    "data=synthetic",
    f"data.seq_len={SEQ_LEN}",
    f"batch.global_size={GLOBAL}",
    "batch.micro_size=2",
    "logger=none",
]


@pytest.fixture(scope="module")
def llama_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama's config.json (the run starts from ladder's own random weights)."""
    folder = tmp_path_factory.mktemp("llama")
    transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    ).save_pretrained(folder)
    return folder


def test_zero3_sgd_run_exports_mid_run_and_a_ddp_run_from_it_continues_its_losses(
    llama_config: Path, tmp_path: Path
):
    original = run_train(
        "gpus=2",
        "parallel=zero3",
        "model=hf",
        f"model.hf_config={llama_config}",
        *COMMON,
        f"train.steps={STEPS}",
        f"train.checkpoint_every={EXPORTED}",
        run_dir=tmp_path / "zero3",
    )
    assert original.returncode == 0, original.stderr[-3000:]

    out = tmp_path / "exported"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner.cli",
            "export",
            str(original.run_dir),
            str(out),
            "--step",
            str(EXPORTED),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]

    resumed = run_train(
        "gpus=1",
        "parallel=ddp",
        "model=hf",
        f"model.hf_config={out}",
        f"model.init_from={out}",
        f"data.skip_steps={EXPORTED}",
        *COMMON,
        f"train.steps={STEPS - EXPORTED}",
        run_dir=tmp_path / "ddp",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # ZeRO-3 on 2 ranks and ddp on 1 differ in summation order only: the fp32 layout tolerance.
    expected = [m["loss"] for m in original.metrics[EXPORTED:STEPS]]
    losses = [m["loss"] for m in resumed.metrics]
    assert len(losses) == len(expected) == STEPS - EXPORTED
    worst = max(abs(a - b) for a, b in zip(losses, expected, strict=True))
    assert worst <= FP32_TOLERANCE, (losses, expected)
