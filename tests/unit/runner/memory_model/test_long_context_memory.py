"""The long-context options' activation terms against the bytes blocks save for backward.

Each block of runner/model/transformer.py runs as ``Transformer.final_hidden`` runs it
(``checkpointed_block``), on CPU, with ``torch.autograd.graph.saved_tensors_hooks`` counting every
storage autograd saves (each once); under op-level selective recompute the outputs torch's
selective checkpoint keeps in its own cache are added (runner/model/op_recompute.py ``kept_outputs``,
what the ledger counts). The plan's term (runner/memory_model/activations.py) must be within 2%
on three shapes; here it is exact.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._pytree import tree_flatten

from runner.config import ModelConfig, Recompute
from runner.memory_model.activations import (
    activation_items_total,
    activations_per_layer,
    mlp_piece_bytes,
    model_block_shape,
    offloaded_block_inputs,
)
from runner.model.activation_offload import checkpoint_offload, offloading
from runner.model.op_recompute import kept_outputs
from runner.model.transformer import TransformerBlock, checkpointed_block, rope_cache

pytestmark = pytest.mark.unit

REL_TOL = 0.02
# (micro, seq, model): heads of 32 and 16 wide, grouped key/values, MLPs 2.7x and 2.67x wide.
SHAPES = [
    (2, 64, ModelConfig(n_layer=1, n_head=4, d_model=128, ffn_hidden=344)),
    (1, 96, ModelConfig(n_layer=1, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=172)),
    (3, 40, ModelConfig(n_layer=1, n_head=6, n_kv_head=2, d_model=96, ffn_hidden=256)),
]
DTYPES = {torch.float32: 4, torch.bfloat16: 2}


def saved_bytes_per_layer(cfg: ModelConfig, *, micro: int, seq: int, dtype: torch.dtype) -> int:
    """Bytes one block saves for backward: autograd's saved tensors and selective recompute's cache."""
    torch.manual_seed(0)
    block = TransformerBlock(cfg).train()
    for param in block.parameters():  # parameters only: RoPE's tables stay fp32, as DeepSpeed keeps them
        param.data = param.data.to(dtype)
    cos, sin = rope_cache(cfg, seq)
    x0 = torch.randn(micro, seq, cfg.d_model, dtype=dtype, requires_grad=True)
    exclude = {t.untyped_storage().data_ptr() for t in [*block.parameters(), cos, sin, x0]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with kept_outputs() as cached, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x = x0 * 1.0  # the block's input, made inside the measured region as the previous block's output
        out = checkpointed_block(block, x, cos, sin, cfg.activation_checkpointing, training=True)
    for t in tree_flatten(cached)[0]:  # an op's output may be a tuple (the attention kernel's)
        if isinstance(t, torch.Tensor):
            pack(t)
    del out
    return sum(seen.values())


def planned_per_layer(cfg: ModelConfig, *, micro: int, seq: int, dtype: torch.dtype) -> int:
    """The plan's activation term for one block (runner.memory.activations_per_layer)."""
    block = model_block_shape(cfg, seq_len=seq, micro_size=micro, tp=1, bytes_per_elem=DTYPES[dtype])
    return activations_per_layer(block, cfg.activation_checkpointing)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
@pytest.mark.parametrize("recompute", list(Recompute))
@pytest.mark.parametrize(("micro", "seq", "model"), SHAPES, ids=["mha", "gqa", "odd"])
def test_mlp_in_pieces_keeps_what_the_plan_counts(
    micro: int, seq: int, model: ModelConfig, recompute: Recompute, dtype: torch.dtype
) -> None:
    """model.mlp_tiles=4: TiledMLP keeps its input alone; the four ffn-wide tensors are gone."""
    whole = dataclasses.replace(model, activation_checkpointing=recompute)
    tiled = dataclasses.replace(whole, mlp_tiles=4)
    measured = saved_bytes_per_layer(tiled, micro=micro, seq=seq, dtype=dtype)
    assert planned_per_layer(tiled, micro=micro, seq=seq, dtype=dtype) == pytest.approx(measured, rel=REL_TOL)
    saved = saved_bytes_per_layer(whole, micro=micro, seq=seq, dtype=dtype) - measured
    p, sbf = DTYPES[dtype], micro * seq * model.ffn_hidden
    expected = {
        Recompute.none: 4 * p * sbf,
        Recompute.attention: 4 * p * sbf,
        Recompute.selective: p * sbf + p * micro * seq * model.d_model,  # w1's and w2's outputs
        Recompute.full: 0,
    }
    assert saved == expected[recompute]


def test_a_piece_rebuilds_four_ffn_wide_tensors() -> None:
    """What TiledMLP's backward rebuilds at once: one piece's four tensors, c = ceil(sb / n) tokens."""
    block = model_block_shape(
        dataclasses.replace(SHAPES[0][2], mlp_tiles=3), seq_len=64, micro_size=2, tp=1, bytes_per_elem=2
    )
    assert block.mlp_piece == 43  # 128 tokens: 43, 43, 42
    assert mlp_piece_bytes(block) == 4 * 2 * 43 * 344
    assert mlp_piece_bytes(dataclasses.replace(block, mlp_tiles=1)) == 0


N_LAYERS = 4


def offloaded_bytes_per_layer(
    cfg: ModelConfig, *, micro: int, seq: int, dtype: torch.dtype
) -> tuple[int, int]:
    """(device, host) bytes a stack of N_LAYERS blocks saves for backward, per layer, under DeepSpeed's
    offload: its saved-tensors hook takes each marked tensor saved outside the checkpoints (each block's
    input) into its keeping and leaves the rest; inside a checkpoint nothing is kept.
    """
    from deepspeed.runtime.activation_checkpointing.offload_activations import _OffloadedTensorRef

    torch.manual_seed(0)
    blocks = [TransformerBlock(cfg).train() for _ in range(N_LAYERS)]
    for param in (p for block in blocks for p in block.parameters()):
        param.data = param.data.to(dtype)
    cos, sin = rope_cache(cfg, seq)
    x0 = torch.randn(micro, seq, cfg.d_model, dtype=dtype, requires_grad=True)
    exclude = {t.untyped_storage().data_ptr() for b in blocks for t in [*b.parameters()]}
    exclude |= {t.untyped_storage().data_ptr() for t in (cos, sin, x0)}
    offload = checkpoint_offload()
    pack = offload.pack_hook
    device: dict[int, int] = {}
    taken = 0  # bytes the offload took in its own keeping (copied out, or kept last)

    def measured_pack(t: torch.Tensor) -> object:
        nonlocal taken
        packed = pack(t)
        storage = t.untyped_storage()
        if isinstance(packed, _OffloadedTensorRef):
            taken += storage.nbytes()
        elif storage.data_ptr() not in exclude:
            device[storage.data_ptr()] = storage.nbytes()
        return packed

    offload.pack_hook = measured_pack  # saved_tensors_hooks pushes pack_hook as it is entered
    with offloading(offload):
        x = x0 * 1.0
        for block in blocks:
            x = checkpointed_block(block, x, cos, sin, Recompute.full, training=True)
        # As backward starts: what the offload copied out is on the host; the rest of what it took
        # (the newest input, keep_last) is still on the device.
        on_host = offload.stats.offloaded_bytes
        x.sum().backward()
    assert offload.stats.restored_tensors == offload.stats.offloaded_tensors
    return (sum(device.values()) + taken - on_host) // N_LAYERS, on_host // N_LAYERS


@pytest.mark.usefixtures("unsynchronized")
@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
@pytest.mark.parametrize(("micro", "seq", "model"), SHAPES, ids=["mha", "gqa", "odd"])
def test_offloaded_block_inputs_leave_the_device_as_the_plan_counts(
    micro: int, seq: int, model: ModelConfig, dtype: torch.dtype
) -> None:
    """model.offload_activations: 3 of 4 block inputs on the host, one on the device (keep_last 1)."""
    cfg = dataclasses.replace(model, activation_checkpointing=Recompute.full, offload_activations=True)
    on_device, on_host = offloaded_bytes_per_layer(cfg, micro=micro, seq=seq, dtype=dtype)
    block = model_block_shape(cfg, seq_len=seq, micro_size=micro, tp=1, bytes_per_elem=DTYPES[dtype])
    moved = offloaded_block_inputs(block, n_layers=N_LAYERS)
    kept = N_LAYERS * activations_per_layer(block, Recompute.full) - moved
    assert kept / N_LAYERS == pytest.approx(on_device, rel=REL_TOL)
    assert moved / N_LAYERS == pytest.approx(on_host, rel=REL_TOL)
    items = activation_items_total(
        block, n_layers=N_LAYERS, vocab_size=cfg.vocab_size, recompute=Recompute.full, offloaded=True
    )
    assert items["blocks"] == kept


@pytest.fixture
def unsynchronized(monkeypatch):
    """DeepSpeed's CPU accelerator, reporting itself as a device with its own memory (as a GPU):
    its offload then copies the marked inputs to host buffers (runner/model/activation_offload.py)."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_synchronized_device", lambda self: False)


def test_the_plan_moves_the_inputs_to_the_host_on_a_gpu_and_not_on_a_cpu() -> None:
    """plan=true, tiny under full recompute: on an H100 the host gains (n - 1) p sbh and the device's
    activation peak, which is in backward at the rebuilt block where its input is back from the host,
    drops by (n - 2) p sbh; on this CPU (the host is the device) nothing moves."""
    from train_helpers import compose_config

    from runner.plan.planner import plan_config

    common = ("logger=none", "model.activation_checkpointing=full", "batch.micro_size=4")
    for cluster, moves in (("cluster=h100_sxm", True), ("cluster=local", False)):
        plain = plan_config(compose_config(cluster, *common))
        offloaded = plan_config(compose_config(cluster, *common, "model.offload_activations=true"))
        cfg = offloaded.workload.model
        one = 4 * 4 * offloaded.workload.seq_len * cfg.d_model  # fp32, micro 4
        assert plain.memory.activations - offloaded.memory.activations == (
            (cfg.n_layer - 2) * one if moves else 0
        )
        assert offloaded.memory.host.get("activations", 0) == ((cfg.n_layer - 1) * one if moves else 0)
