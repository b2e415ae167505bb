"""Hugging Face round trips: a transformers model's weights start a run (model.init_from), and the
run's checkpoint comes back out as a directory transformers loads (ladder export), with the
tokenizer its token file was made with."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from train_helpers import ROOT, USERS_SAVE_FINAL, TrainResult, clean_env, run_train

from runner.checkpoint.hf_export import ExportError, export
from runner.config import DataConfig, DataName
from runner.data.batches import BatchSource
from runner.data.tokenizer_dir import tokenizer_sha256, tokenizer_shas
from runner.engine.fixes import pickle_in_checkpoints as safe_load
from runner.model.transformer import build_model

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.e2e, pytest.mark.hf]

SEQ_LEN, GLOBAL, STEPS = 32, 4, 2
TAG = "step_00000002"
EOS = "<|endoftext|>"
# The standard library's own prose: what the tokenizer learns and the token file holds.
TEXT = "\n\n".join(doc or "" for doc in (json.__doc__, shutil.__doc__, subprocess.__doc__))


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A BPE tokenizer of 200 ids (within the Qwen2's 256) saved by transformers' save_pretrained
    without an eos_token, and TEXT turned by ``ladder tokenize --eos`` into the token file the run
    trains on."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("tokenizer")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([TEXT] * 4, trainers.BpeTrainer(vocab_size=200, special_tokens=[EOS]))
    directory = root / "tokenizer"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)
    (root / "text.txt").write_text(TEXT)
    tokens = root / "tokens.bin"
    ladder = str(Path(sys.executable).parent / "ladder")
    done = subprocess.run(
        [
            ladder,
            "tokenize",
            "--tokenizer",
            str(directory),
            "text.txt",
            "--split",
            "line",
            "--workers",
            "1",
            "--eos",
            EOS,
            "--out",
            str(tokens),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"tokenizer": directory, "tokens": tokens}


def _data(tokenized: dict[str, Path]) -> DataConfig:
    return DataConfig(name=DataName.text, seq_len=SEQ_LEN, path=str(tokenized["tokens"]))


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 (q/k/v biases, untied head) with random weights, as save_pretrained writes it."""
    folder = tmp_path_factory.mktemp("qwen2")
    config = transformers.Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        use_sliding_window=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():  # biases drawn, not zero: a bias that went missing would show
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def imported_run(
    tmp_path_factory: pytest.TempPathFactory, qwen2_dir: Path, tokenized: dict[str, Path]
) -> TrainResult:
    """Two fp32 steps from the Qwen2's weights on the tokenized text, and the checkpoint after the
    last step that a run saves by default (train.save_final), which ladder export reads."""
    run_dir = tmp_path_factory.mktemp("imported") / "run"
    result = run_train(
        "model=hf",
        f"model.hf_config={qwen2_dir}",
        f"model.init_from={qwen2_dir}",
        f"data.path={tokenized['tokens']}",
        f"data.tokenizer={tokenized['tokenizer']}",
        f"data.seq_len={SEQ_LEN}",
        f"batch.global_size={GLOBAL}",
        f"batch.micro_size={GLOBAL}",
        f"train.steps={STEPS}",
        "logger=none",
        run_dir=run_dir,
        env=USERS_SAVE_FINAL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _export(*args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.pop("DS_ACCELERATOR", None)  # as a user's shell has it: this process's ranks' choice is not theirs
    return subprocess.run(
        [sys.executable, "-m", "runner.cli", "export", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )


def test_step_0_loss_after_import_is_transformers_loss_on_the_same_batch(
    imported_run: TrainResult, qwen2_dir: Path, tokenized: dict[str, Path]
):
    inputs, targets = BatchSource(_data(tokenized), 256, seed=0, global_size=GLOBAL).global_batch(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen2_dir).eval()
    with torch.no_grad():
        expected = F.cross_entropy(model(inputs).logits.flatten(0, 1), targets.flatten()).item()
    loss = imported_run.metrics[0]["loss"]
    assert abs(loss - expected) <= 1e-5 * abs(expected), (loss, expected)
    # the run says where its weights came from, and records it
    build = imported_run.summary["model_build"]
    read = build["init_from"]
    assert read["path"] == str(qwen2_dir.resolve()) and read["bytes"] == 4 * build["num_params"]  # fp32 files
    said = (
        f"model.init_from: {read['tensors']} tensors, {read['bytes'] / 1e9:.3f} GB, read from {read['path']}"
    )
    assert said in imported_run.stdout + imported_run.stderr


@pytest.fixture(scope="module")
def exported(imported_run: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The imported run's checkpoint exported, in shards of at most 100 KB."""
    out = tmp_path_factory.mktemp("exported") / "model"
    done = _export(str(imported_run.run_dir), str(out), "--max-shard-size", "100KB")
    assert done.returncode == 0, done.stderr
    assert "peak host memory" in done.stdout
    # DeepSpeed's guess of the accelerator, logged to stdout (deepspeed/accelerator/real_accelerator.py)
    assert "Setting accelerator to CPU" not in done.stdout + done.stderr
    return out


def _ladder_at_checkpoint(run_dir: Path) -> torch.nn.Module:
    """ladder's model with the weights of the run's stage-0 checkpoint, under ladder's own names."""
    from runner.checkpoint.hf_export import model_config

    ladder = build_model(model_config(run_dir))
    states = safe_load.load(run_dir / "checkpoints" / TAG / "mp_rank_00_model_states.pt")
    ladder.load_state_dict(states["module"])
    return ladder


def test_export_loads_in_transformers_with_ladders_logits(imported_run: TrainResult, exported: Path):
    index = json.loads((exported / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # several shards, as the size asked
    provenance = json.loads((exported / "ladder_export.json").read_text())
    assert provenance["tag"] == TAG and provenance["completed_steps"] == STEPS

    model = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    ladder = _ladder_at_checkpoint(imported_run.run_dir)
    tokens = torch.randint(0, 256, (2, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        difference = (model(tokens).logits - ladder(tokens)).abs().max().item()
    assert difference <= 1e-4


def test_a_run_from_the_export_starts_from_the_checkpoints_weights(
    imported_run: TrainResult, exported: Path, tokenized: dict[str, Path], tmp_path: Path
):
    """Exported, then imported again under ddp, reading on from the run's data
    (data.skip_steps): the new run's first loss is the checkpoint's model's loss on the batch of
    the run's next step (AdamW's moments and the schedule start afresh: an export carries
    weights only)."""
    result = run_train(
        "model=hf",
        f"model.hf_config={exported}",
        f"model.init_from={exported}",
        f"data.path={tokenized['tokens']}",
        f"data.tokenizer={exported}",  # the tokenizer the export carries
        f"data.skip_steps={STEPS}",
        f"data.seq_len={SEQ_LEN}",
        f"batch.global_size={GLOBAL}",
        f"batch.micro_size={GLOBAL}",
        "train.steps=1",
        "logger=none",
        run_dir=tmp_path / "run",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    inputs, targets = BatchSource(_data(tokenized), 256, seed=0, global_size=GLOBAL).global_batch(STEPS)
    with torch.no_grad():
        logits = _ladder_at_checkpoint(imported_run.run_dir)(inputs)
        expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    loss = result.metrics[0]["loss"]
    assert abs(loss - expected) <= 1e-5 * abs(expected), (loss, expected)


def test_export_carries_the_runs_tokenizer(exported: Path, tokenized: dict[str, Path]):
    """AutoTokenizer loads the export's copy, which encodes as the tokenizer the run trained with
    and ends a document with the token ``ladder tokenize --eos`` ended them with, which the
    tokenizer's own files did not name; ladder_export.json names the tokenizer by its sha256."""
    original = transformers.AutoTokenizer.from_pretrained(tokenized["tokenizer"])
    copied = transformers.AutoTokenizer.from_pretrained(exported)
    text = TEXT.splitlines()[0] + " " + EOS
    assert copied(text)["input_ids"] == original(text)["input_ids"]
    assert len(original(text)["input_ids"]) > 3
    assert (original.eos_token, copied.eos_token) == (None, EOS)
    provenance = json.loads((exported / "ladder_export.json").read_text())
    assert provenance["tokenizer"]["sha256"] == tokenizer_sha256(tokenized["tokenizer"])
    assert provenance["tokenizer"]["eos_token"] == EOS
    for file in tokenized["tokenizer"].iterdir():  # the copy is the run's tokenizer, its eos named
        if file.name != "tokenizer_config.json":
            assert (exported / file.name).read_bytes() == file.read_bytes(), file.name


def test_export_refuses_a_changed_or_missing_tokenizer_before_writing(
    imported_run: TrainResult, exported: Path, tokenized: dict[str, Path], tmp_path: Path
):
    """A run whose recorded tokenizer changed, or is gone, exports only when told where the same
    tokenizer is (--tokenizer) or to leave it out (--no-tokenizer)."""
    run_dir = tmp_path / "run"  # a copy, its summary.json pointed at a tokenizer that changes
    shutil.copytree(imported_run.run_dir, run_dir)
    moved = tmp_path / "tokenizer"
    shutil.copytree(tokenized["tokenizer"], moved)
    summary = json.loads((run_dir / "summary.json").read_text())
    recorded = summary["tokenizer"]["sha256"]
    summary["tokenizer"]["path"] = str(moved)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    config = json.loads((moved / "tokenizer_config.json").read_text())
    (moved / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 7}))
    changed = tokenizer_sha256(moved)

    out = tmp_path / "out"
    done = _export(str(run_dir), str(out))
    assert done.returncode == 2, done.stderr[-3000:]
    for words in (str(moved), changed, recorded, "--tokenizer DIR", "--no-tokenizer"):
        assert words in done.stderr, words
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))

    shutil.rmtree(moved)
    with pytest.raises(ExportError, match=f"{moved} .*no longer exists.*--tokenizer DIR"):
        export(run_dir, out)
    assert not out.exists()

    export(run_dir, out, tokenizer=tokenized["tokenizer"])
    assert recorded in tokenizer_shas(out)  # the run's tokenizer, its end-of-text token named
    export(run_dir, out, force=True, with_tokenizer=False)
    assert not (out / "tokenizer.json").exists()
    assert json.loads((out / "ladder_export.json").read_text())["tokenizer"] is None


def test_export_refuses_a_non_empty_out_dir_and_a_run_without_checkpoint(
    imported_run: TrainResult, tmp_path: Path
):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    done = _export(str(imported_run.run_dir), str(out))
    assert done.returncode == 2
    assert f"OUT_DIR {out} is not empty" in done.stderr and "--force" in done.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert not list(tmp_path.glob(".taken.partial-*"))

    empty_run = tmp_path / "run"
    (empty_run / ".hydra").mkdir(parents=True)
    (empty_run / ".hydra" / "config.yaml").write_text("model:\n  name: tiny\n")
    done = _export(str(empty_run), str(tmp_path / "new"))
    assert done.returncode == 2
    assert "no complete checkpoint" in done.stderr and "train.checkpoint_every" in done.stderr
    assert not (tmp_path / "new").exists()

    done = _export(str(imported_run.run_dir), str(tmp_path / "new"), "--step", "1")
    assert done.returncode == 2
    assert "--step 1" in done.stderr and "try --step in {2}" in done.stderr


def test_init_from_with_a_wrong_shape_is_refused_before_launch(qwen2_dir: Path, tmp_path: Path):
    result = run_train(
        "model=tiny",  # d_model 256: the Qwen2's is 64
        f"model.init_from={qwen2_dir}",
        "logger=none",
        run_dir=tmp_path / "run",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    said = result.stderr
    assert (
        f"model.init_from={qwen2_dir}: model.embed_tokens.weight has shape (256, 64), this model's (256, 256)"
        in said
    )
    assert "model.hf_config" in said  # the fix
    assert not (tmp_path / "run" / "checkpoints").exists()
