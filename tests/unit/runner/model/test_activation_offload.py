"""model.offload_activations: the checkpointed blocks' inputs go through DeepSpeed's offload and come
back for backward, with the same loss and gradients.

On a CPU rank DeepSpeed's offload moves nothing (the host is the device: ``_should_skip`` skips a
synchronized device's tensors). To see the mechanism here, the CPU accelerator is told it is not
synchronized: the marked inputs are then copied into host buffers in forward and back in backward,
as on a GPU, only the "host" being the same memory.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runner.config import ModelConfig, Recompute
from runner.model.activation_offload import checkpoint_offload, offloading
from runner.model.transformer import build_model

pytestmark = pytest.mark.unit

SMALL = ModelConfig(
    n_layer=4,
    n_head=4,
    n_kv_head=2,
    d_model=64,
    ffn_hidden=172,
    vocab_size=1000,
    activation_checkpointing=Recompute.full,
    offload_activations=True,
)
MICRO, SEQ = 3, 50


@pytest.fixture
def unsynchronized(monkeypatch):
    """DeepSpeed's CPU accelerator, reporting itself as a device with its own memory."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_synchronized_device", lambda self: False)


def _loss_and_grads(cfg: ModelConfig, offload=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = build_model(cfg, seed=0).train()
    tokens = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1), generator=torch.Generator().manual_seed(1))
    if offload is None:
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
    else:
        with offloading(offload):
            loss = model(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def test_the_block_inputs_go_to_the_host_and_back_with_the_same_loss_and_gradients(unsynchronized) -> None:
    """All but the last block's input are copied out in forward and back in backward (DeepSpeed's
    keep_last_count 1): 3 of 4 here, 3 x 4 B x 150 tokens x 64 = 115,200 B; loss and gradients equal
    the run without offload bit for bit."""
    whole, whole_grads = _loss_and_grads(dataclasses.replace(SMALL, offload_activations=False))
    offload = checkpoint_offload()
    moved, moved_grads = _loss_and_grads(SMALL, offload)
    stats = offload.stats
    assert (stats.marked_tensors, stats.offloaded_tensors, stats.kept_last_tensors) == (4, 3, 1)
    assert stats.restored_tensors == 3
    assert stats.offloaded_bytes == stats.restored_bytes == 3 * 4 * MICRO * SEQ * SMALL.d_model
    assert torch.equal(moved, whole)
    for name, grad in whole_grads.items():
        assert torch.equal(moved_grads[name], grad), name


def test_on_a_cpu_rank_nothing_moves() -> None:
    """DeepSpeed skips a synchronized device's tensors: marked, skipped, and the same loss."""
    whole, _ = _loss_and_grads(dataclasses.replace(SMALL, offload_activations=False))
    offload = checkpoint_offload()
    loss, _ = _loss_and_grads(SMALL, offload)
    assert (offload.stats.marked_tensors, offload.stats.skipped_marked_tensors) == (4, 4)
    assert offload.stats.offloaded_tensors == 0
    assert torch.equal(loss, whole)


def test_without_an_open_offload_or_outside_full_recompute_nothing_is_marked(unsynchronized) -> None:
    """Evaluation and the other recompute modes mark nothing; a model run outside ``offloading`` neither."""
    offload = checkpoint_offload()
    _loss_and_grads(dataclasses.replace(SMALL, activation_checkpointing=Recompute.selective), offload)
    assert offload.stats.marked_tensors == 0
    _loss_and_grads(SMALL)  # no offload open: checkpointed_block marks nothing, and nothing fails
