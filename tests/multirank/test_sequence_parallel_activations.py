"""What a sequence-parallel rank's blocks save for backward against the plan's activation term.

Two gloo ranks, started here as children of the test (``python`` on this file: each joins the
group as a launcher's rank would, :func:`_child`), form one sequence-parallel group of 2
(runner/parallel/sequence.py ``sequence_groups``, ``split_sequence``): each holds half of every
sample's tokens, and its attentions run through DeepSpeed's ``DistributedAttention``. Each rank
runs one block of the Transformer as ``Transformer.final_hidden`` runs it (``checkpointed_block``)
on its piece of the sequence, at its tokens' positions, in every recompute mode, whole and with the
MLP in pieces (``model.mlp_tiles``), fp32, and counts what it keeps for backward as
tests/unit/runner/memory_model/test_long_context_memory.py does on one rank: every storage autograd
saves (each once, parameters and RoPE's tables left out) and the outputs op-level selective
recompute keeps in its own cache (runner/model/op_recompute.py ``kept_outputs``); then runs the
block's backward, whose recompute repeats the all-to-alls on both ranks. A 2-layer model is
measured the same way from the whole samples to the loss, whole and in pieces (``model.loss_tiles``).

The plan (runner/memory_model/case.py) models a rank's activations as the whole model's at
``seq_len / sp`` tokens (``MemoryCase.rank_seq_len``): the attention over the whole sequence of
``heads / sp`` heads holds as many elements as the attention of all heads over ``seq_len / sp``.
The plan's per-layer term must be within 2% of the measurement on three shapes, in every mode;
here it is exact (DeepSpeed's all-to-alls save nothing, SDPA saves their outputs, and the output's
all-to-all returns the contiguous tensor wo saves). docs/memory-and-plan.md prints the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from train_helpers import ROOT, clean_env, memory_case

from launchers.local import free_port
from runner.config import ModelConfig, Recompute
from runner.memory_model.activations import TRANSIENT_ITEMS, activation_items_total, activations_per_layer
from runner.memory_model.case import held_states

pytestmark = pytest.mark.multirank

SP = 2
REL_TOL = 0.02
# (micro, seq, model), as test_long_context_memory.py's: heads of 32 and 16 wide, grouped
# key/values (one key/value head per rank at sp 2), MLPs 2.7x and 2.67x wide, 3 heads per rank.
SHAPES = {
    "mha": (2, 64, ModelConfig(n_layer=1, n_head=4, d_model=128, ffn_hidden=344)),
    "gqa": (1, 96, ModelConfig(n_layer=1, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=172)),
    "odd": (3, 40, ModelConfig(n_layer=1, n_head=6, n_kv_head=2, d_model=96, ffn_hidden=256)),
}
MLP_TILES = (1, 4)  # a block's MLP whole, and in DeepSpeed's TiledMLP pieces
LOSS_TILES = (1, 3)  # a whole model's head and loss whole, and in pieces (tiled_lm_loss)


def _block_cases() -> list[tuple[str, Recompute, int]]:
    return [(shape, mode, tiles) for shape in SHAPES for mode in Recompute for tiles in MLP_TILES]


def _model_cases() -> list[tuple[str, Recompute, int]]:
    return [(shape, mode, tiles) for shape in SHAPES for mode in Recompute for tiles in LOSS_TILES]


def _block(shape: str, mode: Recompute, mlp_tiles: int) -> tuple[int, int, ModelConfig]:
    """(micro, seq, one block's model) of a shape, in a recompute mode, its MLP in ``mlp_tiles`` pieces."""
    micro, seq, model = SHAPES[shape]
    return micro, seq, dataclasses.replace(model, activation_checkpointing=mode, mlp_tiles=mlp_tiles)


def _whole(shape: str, mode: Recompute, loss_tiles: int) -> tuple[int, int, ModelConfig]:
    """(micro, seq, a 2-layer model) of a shape, in a recompute mode, its loss in ``loss_tiles`` pieces."""
    micro, seq, model = SHAPES[shape]
    return (
        micro,
        seq,
        dataclasses.replace(
            model, n_layer=2, vocab_size=256, activation_checkpointing=mode, loss_tiles=loss_tiles
        ),
    )


def _key(shape: str, mode: Recompute, tiles: int) -> str:
    return f"{shape}:{mode.value}:{tiles}"


def _saving(exclude: set[int]) -> tuple[dict[int, int], Any]:
    """A dict of the bytes of each storage packed (each once, none in ``exclude``) and the pack hook."""
    import torch

    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    return seen, pack


@contextlib.contextmanager
def _counting(exclude: set[int]) -> Iterator[dict[int, int]]:
    """Bytes saved for backward while open: autograd's saved tensors and selective recompute's cache."""
    import torch
    from torch.utils._pytree import tree_flatten

    from runner.model.op_recompute import kept_outputs

    seen, pack = _saving(exclude)
    with kept_outputs() as cached, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen
    for t in tree_flatten(cached)[0]:  # an op's output may be a tuple (the attention kernel's)
        if isinstance(t, torch.Tensor):
            pack(t)


def _split_model(cfg: ModelConfig, *, seq: int, groups: Any) -> Any:
    """A Transformer for ``cfg`` running this rank's piece of each sample of ``seq`` tokens."""
    import torch

    from runner.model.transformer import Transformer
    from runner.parallel.sequence import split_sequence

    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(cfg, max_seq_len=seq)).train()
    split_sequence(model, groups)
    return model


def _saved_bytes_per_layer(cfg: ModelConfig, *, micro: int, seq: int, groups: Any) -> int:
    """Bytes one block keeps for backward on this rank of the sequence group, then its backward."""
    import torch

    from runner.model.transformer import checkpointed_block, rope_cache

    model = _split_model(cfg, seq=seq, groups=groups)
    shard, block = model.sequence_shard, model.layers[0]
    first, length = shard.first_position(seq), shard.length(seq)
    cos, sin = (table[first : first + length] for table in rope_cache(cfg, seq))  # this piece's positions
    x0 = torch.randn(micro, length, cfg.d_model, requires_grad=True)  # (B, T/sp, C)
    with _counting({t.untyped_storage().data_ptr() for t in [*model.parameters(), cos, sin, x0]}) as seen:
        x = x0 * 1.0  # the block's input, made inside the measured region as the previous block's output
        out = checkpointed_block(block, x, cos, sin, cfg.activation_checkpointing, training=True)
    out.square().sum().backward()  # both ranks: the recompute repeats the all-to-alls
    return sum(seen.values())


def _saved_bytes_of_model(cfg: ModelConfig, *, micro: int, seq: int, groups: Any) -> int:
    """Bytes a whole model keeps for backward on this rank, its loss formed, then its backward."""
    import torch

    model = _split_model(cfg, seq=seq, groups=groups)
    samples = torch.randint(0, cfg.vocab_size, (micro, seq + 1))
    exclude = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), samples]}
    with _counting(exclude) as seen:
        # The whole samples, as the rank's batch holds them: the model takes its piece.
        loss = model(samples[:, :-1].clone(), samples[:, 1:].clone())
    loss.backward()
    return sum(seen.values())


def _child() -> None:
    """Every case's bytes on this rank; rank 0 prints both ranks' as JSON."""
    import deepspeed
    import torch.distributed as dist

    from runner.engine.distributed import skip_inference_shm_op
    from runner.parallel.sequence import sequence_groups

    skip_inference_shm_op()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    groups = sequence_groups(SP)
    mine: dict[str, dict[str, int]] = {"block": {}, "model": {}}
    for shape, mode, tiles in _block_cases():
        micro, seq, cfg = _block(shape, mode, tiles)
        mine["block"][_key(shape, mode, tiles)] = _saved_bytes_per_layer(
            cfg, micro=micro, seq=seq, groups=groups
        )
    for shape, mode, tiles in _model_cases():
        micro, seq, cfg = _whole(shape, mode, tiles)
        mine["model"][_key(shape, mode, tiles)] = _saved_bytes_of_model(
            cfg, micro=micro, seq=seq, groups=groups
        )
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        print(json.dumps(every))
    dist.barrier()


def _case(cfg: ModelConfig, *, micro: int, seq: int) -> Any:
    """The plan's MemoryCase of a rank at sp 2 (runner/memory_model/case.py), fp32 on CPU."""
    return memory_case(
        model=cfg,
        precision="fp32",
        optimizer="adamw",
        zero_stage=1,
        sp=SP,
        recompute=cfg.activation_checkpointing,
        seq_len=seq,
        micro_size=micro,
        dp=1,
        host_is_device=True,
    )


def planned_per_layer(cfg: ModelConfig, *, micro: int, seq: int) -> int:
    """The plan's activation term for one block of a rank at sp 2 (runner.memory_model.activations)."""
    block = held_states(_case(cfg, micro=micro, seq=seq)).block
    return activations_per_layer(block, cfg.activation_checkpointing)


def planned_model(cfg: ModelConfig, *, micro: int, seq: int) -> int:
    """The plan's bytes a rank's whole model keeps for backward at sp 2: every item but the transients."""
    block = held_states(_case(cfg, micro=micro, seq=seq)).block
    items = activation_items_total(
        block, n_layers=cfg.n_layer, vocab_size=cfg.vocab_size, recompute=cfg.activation_checkpointing
    )
    return sum(value for name, value in items.items() if name not in TRANSIENT_ITEMS)


def _started_ranks() -> list[dict[str, dict[str, int]]]:
    """Each rank's bytes per case, from two ranks started here."""
    env = {
        **clean_env(),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "DS_ACCELERATOR": "cpu",
        "WORLD_SIZE": str(SP),
        "LOCAL_WORLD_SIZE": str(SP),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for rank in range(SP)
    ]
    outputs = [rank.communicate(timeout=300) for rank in ranks]
    for rank, (_, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err[-3000:]
    result: list[dict[str, dict[str, int]]] = json.loads(outputs[0][0].strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def measured() -> list[dict[str, dict[str, int]]]:
    """Each rank's bytes per case (rank 0's first)."""
    return _started_ranks()


@pytest.mark.parametrize(
    ("shape", "mode", "tiles"), _block_cases(), ids=[_key(*case) for case in _block_cases()]
)
def test_a_sequence_parallel_block_keeps_what_the_plan_counts(
    measured: list[dict[str, dict[str, int]]], shape: str, mode: Recompute, tiles: int
) -> None:
    """sp 2, the MLP whole or in 4 pieces: the plan's per-layer bytes at seq_len / 2 tokens equal
    what each rank's block keeps."""
    micro, seq, cfg = _block(shape, mode, tiles)
    kept = [rank["block"][_key(shape, mode, tiles)] for rank in measured]
    assert kept[0] == kept[1]  # the pieces differ in their positions only
    assert planned_per_layer(cfg, micro=micro, seq=seq) == pytest.approx(kept[0], rel=REL_TOL)


@pytest.mark.parametrize(
    ("shape", "mode", "tiles"), _model_cases(), ids=[_key(*case) for case in _model_cases()]
)
def test_a_sequence_parallel_model_keeps_what_the_plan_counts(
    measured: list[dict[str, dict[str, int]]], shape: str, mode: Recompute, tiles: int
) -> None:
    """sp 2, the loss whole or in 3 pieces: the plan's kept bytes of a 2-layer model (blocks,
    embedding, final norm, head, loss) against what rank 0 keeps: over by a few hundred bytes, the
    whole samples' token ids and targets the pieces are views of (the plan counts the pieces')."""
    micro, seq, cfg = _whole(shape, mode, tiles)
    kept = measured[0]["model"][_key(shape, mode, tiles)]
    assert planned_model(cfg, micro=micro, seq=seq) == pytest.approx(kept, rel=REL_TOL)


if __name__ == "__main__":
    _child()
