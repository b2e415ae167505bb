"""A Qwen2 config.json (q/k/v biases) trains alike in every layout: tp splits the biases with wq/wk/wv.

fp32 on CPU, a tiny model from a Qwen2 config.json, 4 steps of global batch 16: one plain rank
against tensor parallel (AutoTP cuts each column-parallel bias along its rows, as its weight),
a pipeline, ZeRO-3 (the biases partitioned or kept whole by the persistence threshold), and
sequence parallelism under ZeRO-1 (2 query heads and 1 key/value head on each rank around attention).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import FP32_TOLERANCE, TrainResult, run_train

pytestmark = pytest.mark.multirank

STEPS = 4
QWEN2 = {
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
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}
LAYOUTS = {
    "plain": ("parallel=ddp", "gpus=1"),
    "tp2": ("parallel=tp2", "gpus=2"),
    "pp2": ("parallel=pp2", "gpus=2"),
    "zero3": ("parallel=zero3", "gpus=2"),
    "sp2": ("parallel=zero1", "parallel.sp=2", "gpus=2"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, TrainResult]:
    """Each layout trained once, one after the other (each uses the host's cores)."""
    root: Path = tmp_path_factory.mktemp("hf_layouts")
    config = root / "config.json"
    config.write_text(json.dumps(QWEN2))
    common = (
        "model=hf",
        f"model.hf_config={config}",
        "batch.global_size=16",
        "batch.micro_size=4",
        "data.seq_len=32",
        "logger=none",
        "optimizer.lr=1e-3",
        f"train.steps={STEPS}",
    )
    results = {}
    for name, layout in LAYOUTS.items():
        results[name] = run_train(*layout, *common, run_dir=root / name, timeout=600)
        assert results[name].returncode == 0, results[name].stderr[-3000:]
    return results


@pytest.mark.parametrize("layout", ["tp2", "pp2", "zero3", "sp2"])
def test_losses_match_one_plain_rank(runs, layout):
    plain, other = runs["plain"].metrics, runs[layout].metrics
    assert len(plain) == len(other) == STEPS
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(plain, other, strict=True))
    print(f"{layout} vs 1 rank: max |dloss| over {STEPS} steps = {worst:.2e}")
    assert worst <= FP32_TOLERANCE
    norms = max(abs(a["grad_norm"] / b["grad_norm"] - 1) for a, b in zip(plain, other, strict=True))
    assert norms <= FP32_TOLERANCE, f"{layout}: gradient norm {norms:.2e} from one rank's"


@pytest.mark.parametrize("layout", ["plain", "tp2", "pp2", "zero3", "sp2"])
def test_the_ledger_estimates_the_parameters_each_rank_holds(runs, layout):
    memory = runs[layout].summary["memory"]
    assert memory["rel_error"]["params"] < 1e-6, memory
