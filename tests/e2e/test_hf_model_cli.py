"""``python train.py model=hf model.hf_config=PATH``, and the real models' presets, as a user runs them."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from train_helpers import ROOT, SHORT_RUN, TrainResult, run_train

pytestmark = pytest.mark.e2e

HF_CONFIGS = ROOT / "conf" / "model" / "hf_configs"
# A Qwen2 config.json of a few hundred thousand parameters: q/k/v biases, grouped-query attention.
TINY_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
}
FILES = {
    "qwen2": TINY_QWEN2,
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768},
    "gelu": {**TINY_QWEN2, "hidden_act": "gelu_pytorch_tanh"},
}
PLAN = ("cluster=h100_sxm", "gpus=64", "plan=true", "logger=none")
COMMANDS = {
    "llama3_8b": ("model=llama3_8b", *PLAN),
    "qwen_recommend": (
        "model=hf",
        f"model.hf_config={HF_CONFIGS / 'qwen2_5_7b.json'}",
        "planner.recommend=true",
        "precision=bf16",
        *PLAN,
    ),
    "train": ("model=hf", "model.hf_config={qwen2}", *SHORT_RUN),
    "gpt2": ("model=hf", "model.hf_config={gpt2}", "logger=none"),
    "gelu": ("model=hf", "model.hf_config={gelu}", "logger=none"),
    "no_path": ("model=hf", "logger=none"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, TrainResult]:
    """Every command once, as many at once as this host has cores."""
    root: Path = tmp_path_factory.mktemp("hf")
    paths = {}
    for name, content in FILES.items():
        paths[name] = root / name / "config.json"
        paths[name].parent.mkdir()
        paths[name].write_text(json.dumps(content))
    # A model directory for the first, the file itself for the others: both are accepted.
    paths = {name: path.parent if name == "qwen2" else path for name, path in paths.items()}

    def run(name: str) -> TrainResult:
        overrides = [o.format(**paths) for o in COMMANDS[name]]
        return run_train(*overrides, run_dir=root / f"run_{name}", timeout=300)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {name: pool.submit(run, name) for name in COMMANDS}
    return {name: future.result() for name, future in futures.items()}


def test_a_real_models_preset_plans_with_its_exact_count(runs):
    result = runs["llama3_8b"]
    assert result.returncode == 3, result.stderr[-2000:]  # plain data parallel: 8B does not fit
    assert "plan: llama3_8b (8,030,261,248 params" in result.stdout
    assert json.loads((result.run_dir / "plan.json").read_text())["exit_code"] == 3


def test_a_hf_config_plans_and_its_recommended_command_carries_the_file(runs):
    result = runs["qwen_recommend"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(7,615,616,512 params" in result.stdout  # q/k/v biases counted: Qwen2.5-7B's own
    command = json.loads((result.run_dir / "plan.json").read_text())["recommendation"]["command"]
    assert command.startswith(f"python train.py model=hf model.hf_config={HF_CONFIGS / 'qwen2_5_7b.json'} ")


def test_a_hf_config_trains_with_the_shape_it_gives(runs):
    result = runs["train"]
    assert result.returncode == 0, result.stderr[-3000:]
    C, kv, F, V = 64, 2 * 16, 128, 256  # width, key/value width, MLP width, vocabulary (tied)
    block = (
        (C * C + C) + 2 * (C * kv + kv) + C * C + 3 * C * F + 2 * C
    )  # wq, wk, wv with biases; wo; MLP; norms
    summary = result.summary
    assert summary["model"] == "hf"
    assert summary["num_params"] == summary["model_build"]["params"] == V * C + 2 * block + C  # as built
    memory = summary["memory"]
    assert memory["measured"]["params_gb"] == memory["estimated"]["params_gb"]
    assert memory["rel_error"]["activations"] < 1e-4  # a bias saves nothing more for backward
    assert len(result.metrics) == 2


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        (
            "gpt2",
            ["architectures=['GPT2LMHeadModel']", "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"],
        ),
        ("gelu", ["hidden_act='gelu_pytorch_tanh'", "hidden_act=silu"]),
        ("no_path", ["model=hf needs model.hf_config=PATH"]),
    ],
)
def test_a_config_ladder_cannot_map_is_refused_before_launch(runs, name, fragments):
    result = runs[name]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "ladder: refused before launch:" in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not result.run_dir.exists(), "a refused run leaves no directory behind"
