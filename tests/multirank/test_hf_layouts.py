"""model.init_from and ladder export on 2 ranks: ZeRO-3 partitions, tensor-parallel shards and
pipeline stages each read their slice of a transformers model's weights, and their checkpoints
export to a directory whose logits are ladder's at that step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from train_helpers import ROOT, TrainResult, clean_env, run_train

from runner.checkpoint.hf_export import model_config
from runner.config import DataConfig, DataName
from runner.data.batches import BatchSource
from runner.model.transformer import build_model

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.multirank, pytest.mark.hf]

SEQ_LEN, GLOBAL, STEPS = 32, 4, 2
TAG = "step_00000002"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama (grouped-query attention, untied head) with random weights, from save_pretrained."""
    folder = tmp_path_factory.mktemp("llama")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["zero3", "tp2", "pp2"])
def layout_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, llama_dir: Path):
    """Two fp32 steps on 2 ranks from the Llama's weights; a checkpoint at the end."""
    run_dir = tmp_path_factory.mktemp(request.param) / "run"
    result = run_train(
        "gpus=2",
        f"parallel={request.param}",
        "model=hf",
        f"model.hf_config={llama_dir}",
        f"model.init_from={llama_dir}",
        "data=synthetic",
        f"data.seq_len={SEQ_LEN}",
        f"batch.global_size={GLOBAL}",
        "batch.micro_size=2",
        f"train.steps={STEPS}",
        f"train.checkpoint_every={STEPS}",
        "logger=none",
        run_dir=run_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _ladder_at_checkpoint(run_dir: Path) -> torch.nn.Module:
    """ladder's model with the checkpoint's weights under ladder's own names, from the universal copy
    the export converted (no Hugging Face name involved)."""
    model = build_model(model_config(run_dir))
    zero = run_dir / "checkpoints" / (TAG + "_universal") / "zero"
    with torch.no_grad():
        for name, param in model.named_parameters():
            held = torch.load(zero / name / "fp32.pt", weights_only=True)
            param.copy_((held["param"] if isinstance(held, dict) else held).reshape(param.shape))
    return model


def test_layout_starts_from_the_imported_weights_and_exports_ladders_logits(
    layout_run: TrainResult, llama_dir: Path, tmp_path: Path
):
    inputs, targets = BatchSource(
        DataConfig(name=DataName.synthetic, seq_len=SEQ_LEN), 256, seed=0, global_size=GLOBAL
    ).global_batch(0)
    source = transformers.AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    with torch.no_grad():
        expected = F.cross_entropy(source(inputs).logits.flatten(0, 1), targets.flatten()).item()
    loss = layout_run.metrics[0]["loss"]
    assert abs(loss - expected) <= 1e-5 * abs(expected), (loss, expected)

    out = tmp_path / "exported"
    done = subprocess.run(
        [sys.executable, "-m", "runner.cli", "export", str(layout_run.run_dir), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ladder = _ladder_at_checkpoint(layout_run.run_dir)
    with torch.no_grad():
        difference = (exported(inputs).logits - ladder(inputs)).abs().max().item()
    assert difference <= 1e-4
    # trained: the exported weights are not the imported ones
    assert not torch.equal(exported.lm_head.weight, source.lm_head.weight)


@pytest.mark.parametrize("layout_run", ["zero3"], indirect=True)  # ZeRO-3's partitions to join
def test_deepspeeds_zero_to_fp32_finds_the_newest_checkpoint_without_a_tag(
    layout_run: TrainResult, tmp_path: Path
):
    """The zero_to_fp32.py DeepSpeed copies beside a ZeRO-3 run's checkpoints reads
    checkpoints/latest, which ladder keeps, and joins the same weights the export reads."""
    assert layout_run.summary["zero_stage"] == 3
    checkpoints = layout_run.run_dir / "checkpoints"
    assert (checkpoints / "latest").read_text() == TAG
    done = subprocess.run(
        [sys.executable, str(checkpoints / "zero_to_fp32.py"), str(checkpoints), str(tmp_path / "fp32")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    joined = torch.load(tmp_path / "fp32" / "pytorch_model.bin", weights_only=True)
    ladder = _ladder_at_checkpoint(layout_run.run_dir)
    for name, param in ladder.named_parameters():
        assert torch.equal(joined[name], param), name
