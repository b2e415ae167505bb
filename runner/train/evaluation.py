"""The held-out loss: the mean cross-entropy over the same held-out sequences at every evaluation.

Every ``train.eval_every`` optimizer steps, and after the last, the ranks read
``train.eval_batches`` global batches of held-out sequences (runner/data/batches.py, ``held_out``),
each cut over the data-parallel ranks and their micro-batches as a training step's is, and
run the forward pass only (``torch.no_grad``, the module in eval mode). The loss is the mean
over every sequence, so a layout change leaves it as it leaves the training loss: the same
experiment, the same number. Under a pipeline DeepSpeed's ``eval_batch`` runs the inference
schedule and averages over micro-batches and pipelines (runner/train/trainer.py ``Trainer._held_out_loss``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from runner.config import DataConfig, DataName, TrainLoopConfig
from runner.data.batches import BatchSource, rank_slice
from runner.data.text_corpus import builtin_held_out_text
from runner.data.token_file import token_source_words
from runner.engine.deepspeed_engine import DeepSpeedEngine
from runner.layout import Layout
from runner.rundir.summary_records import EvalRecord, Evaluated


def held_out_loss(
    engine: DeepSpeedEngine,
    held_out: BatchSource,
    *,
    batches: int,
    layout: Layout,
    dp_rank: int,
    device: torch.device,
) -> float:
    """The mean loss over ``batches`` held-out global batches, the same on every rank."""
    module = engine.module
    total = torch.zeros((), dtype=torch.float64, device=device)
    module.eval()
    try:
        with torch.no_grad():
            for batch in range(batches):
                for micro in range(layout.accum_steps):
                    start = rank_slice(dp_rank, micro, layout.micro_size, layout.accum_steps)
                    inputs, targets = held_out.micro_batch(batch, start, layout.micro_size)
                    total += engine(inputs.to(device), targets.to(device)).double()
    finally:
        module.train()
    # Each rank's mean over its micro-batches, then the mean over ranks (tensor-parallel ranks
    # hold the same loss, so counting each of them leaves the mean as it is).
    local = total / (batches * layout.accum_steps)
    dist.all_reduce(local)
    return float(local) / dist.get_world_size()


def held_out_words(data: DataConfig) -> str:
    """Where the held-out sequences come from, in words."""
    if data.name == DataName.synthetic:
        return "synthetic tokens of the evaluation's own random stream"
    if data.val_path is not None:
        return f"data.val_path: {token_source_words(data.val_path, data.dtype)}"
    size = len(builtin_held_out_text())
    return f"the built-in text's held-out corpus: the standard library's test suites, {size:,} bytes"


def evaluation_summary(
    train: TrainLoopConfig, data: DataConfig, evaluated: Evaluated | None, *, global_size: int
) -> EvalRecord:
    """summary.json's ``eval``: the latest held-out loss, its step, and what it was measured on."""
    return {
        **(evaluated or Evaluated(loss=None, step=None)),
        "every": train.eval_every,
        "sequences": train.eval_batches * global_size,
        "tokens": train.eval_batches * global_size * data.seq_len,
        "source": held_out_words(data),
    }
