"""The Llama-style decoder: parameter counts against published figures, numerics, recompute."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from runner.config import ModelConfig, Recompute
from runner.model.transformer import (
    INIT_CHUNK,
    Attention,
    Transformer,
    build_model,
    initial_values,
    lm_loss,
    num_params,
    write_initial_shard,
    write_initial_values,
)

pytestmark = pytest.mark.unit

TINY = ModelConfig()
GPT2_124M = ModelConfig(
    name="gpt2_124m",
    n_layer=12,
    n_head=12,
    d_model=768,
    ffn_hidden=2048,
    vocab_size=50257,
)
# Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json).
LLAMA_1B = ModelConfig(
    name="llama_1b",
    n_layer=16,
    n_head=32,
    n_kv_head=8,
    d_model=2048,
    ffn_hidden=8192,
    vocab_size=128256,
    rope_theta=500000.0,
)
# Llama 2 7B and 70B (Touvron et al. 2023, arXiv 2307.09288; HF config.json).
LLAMA_7B = ModelConfig(
    name="llama_7b",
    n_layer=32,
    n_head=32,
    d_model=4096,
    ffn_hidden=11008,
    vocab_size=32000,
    tie_embeddings=False,
)
LLAMA_70B = ModelConfig(
    name="llama_70b",
    n_layer=80,
    n_head=64,
    n_kv_head=8,
    d_model=8192,
    ffn_hidden=28672,
    vocab_size=32000,
    tie_embeddings=False,
)


# For the tests that run backward: enough to exercise every path, small enough
# to stay fast on a busy 2-core runner.
SMALL = ModelConfig(name="small", n_layer=2, n_head=4, d_model=128, ffn_hidden=344)


def _unique_params(model: torch.nn.Module) -> int:
    """Elements of distinct Parameter objects (a tied weight counts once)."""
    seen = {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(p.numel() for p in seen.values())


@pytest.mark.parametrize(
    ("cfg", "published"),
    [
        (TINY, 3_229_952),
        # GPT-2 small shapes with SwiGLU and no learned positions or biases:
        # 123.55M, within 0.5% of GPT-2's 124,439,808.
        (GPT2_124M, 123_551_232),
        (LLAMA_1B, 1_235_814_400),
        (LLAMA_7B, 6_738_415_616),
        (LLAMA_70B, 68_976_648_192),
    ],
    ids=lambda v: v.name if isinstance(v, ModelConfig) else str(v),
)
def test_num_params_matches_published_and_module(cfg: ModelConfig, published: int) -> None:
    """The analytic count equals the published figure and the real module on meta."""
    assert num_params(cfg) == published
    model = build_model(cfg, device="meta")
    assert _unique_params(model) == published
    assert model.tok_embeddings.weight.is_meta


def test_gpt2_shapes_are_about_124m() -> None:
    """Sanity band: GPT-2 small's published 124M."""
    assert abs(num_params(GPT2_124M) - 124e6) / 124e6 < 0.01


def test_module_names_used_for_partitioning() -> None:
    """TP partitioning and memory accounting match these names."""
    cfg = dataclasses.replace(TINY, n_layer=1, tie_embeddings=False)
    names = {n for n, _ in build_model(cfg, device="meta").named_parameters()}
    assert names == {
        "tok_embeddings.weight",
        "layers.0.attention_norm.weight",
        "layers.0.attention.wq.weight",
        "layers.0.attention.wk.weight",
        "layers.0.attention.wv.weight",
        "layers.0.attention.wo.weight",
        "layers.0.ffn_norm.weight",
        "layers.0.feed_forward.w1.weight",
        "layers.0.feed_forward.w2.weight",
        "layers.0.feed_forward.w3.weight",
        "norm.weight",
        "output.weight",
    }


def test_forward_shapes_and_dtype() -> None:
    """(B, T) tokens give (B, T, vocab) logits; the loss is an fp32 scalar."""
    torch.manual_seed(0)
    model = build_model(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, TINY.vocab_size)
    loss = lm_loss(logits.bfloat16(), tokens)
    assert loss.shape == () and loss.dtype == torch.float32
    with torch.no_grad():
        half = model.bfloat16()(tokens)  # as under DeepSpeed's bf16 mode
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), logits, atol=0.05, rtol=0.05)


def test_tied_weights_are_one_parameter() -> None:
    """Tied: output and embedding share one Parameter; untied: two."""
    tied = build_model(TINY, device="meta")
    assert tied.output.weight is tied.tok_embeddings.weight
    untied = build_model(dataclasses.replace(TINY, tie_embeddings=False), device="meta")
    assert untied.output.weight is not untied.tok_embeddings.weight


def test_init_deterministic_and_residual_scaled() -> None:
    """Same seed, same weights, whatever the global RNG; wo and w2 use init_std / sqrt(2 n_layer)."""
    torch.manual_seed(1)
    a = build_model(TINY, seed=1)
    torch.manual_seed(2)
    b = build_model(TINY, seed=1)
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name
    c = build_model(TINY, seed=2)
    assert not torch.equal(a.layers[0].attention.wq.weight, c.layers[0].attention.wq.weight)

    std = TINY.init_std
    block = a.layers[0]
    residual = std / math.sqrt(2 * TINY.n_layer)
    assert block.attention.wq.weight.std().item() == pytest.approx(std, rel=0.03)
    assert block.attention.wo.weight.std().item() == pytest.approx(residual, rel=0.03)
    assert block.feed_forward.w2.weight.std().item() == pytest.approx(residual, rel=0.03)
    assert torch.equal(block.attention_norm.weight, torch.ones(TINY.d_model))


def test_each_parameter_is_drawn_from_its_name_alone() -> None:
    """A layout that builds only part of the model (a pipeline stage, a ZeRO-3 shard) gets the same values.

    The value of a parameter depends on the seed and its name, not on which other
    parameters were drawn before it, nor on the global RNG.
    """
    whole = build_model(SMALL, seed=5)
    name = "layers.1.feed_forward.w1.weight"
    alone = initial_values(SMALL, name, whole.get_parameter(name).shape, seed=5)
    assert torch.equal(alone, whole.get_parameter(name).flatten())
    names = [n for n, _ in whole.named_parameters()]
    draws = {n: initial_values(SMALL, n, whole.get_parameter(n).shape, seed=5) for n in reversed(names)}
    for n in names:
        assert torch.equal(draws[n], whole.get_parameter(n).flatten()), n
    other = "layers.0.feed_forward.w1.weight"
    assert not torch.equal(whole.get_parameter(other), whole.get_parameter(name))


def test_a_slice_of_a_parameter_draws_the_whole_values_slice() -> None:
    """A ZeRO-3 partition (any [start, stop), across chunk boundaries) holds its slice of the whole value."""
    name, shape = "layers.0.feed_forward.w1.weight", (1100, 2000)  # 2.2M elements: three chunks
    whole = initial_values(TINY, name, shape, seed=7)
    assert whole.numel() > 2 * INIT_CHUNK
    n = whole.numel()
    for start, stop in [
        (0, n),
        (0, 1),
        (INIT_CHUNK - 3, INIT_CHUNK + 5),
        (n // 2, n // 2),
        (n // 3, n),
        (5, n - 5),
    ]:
        assert torch.equal(
            initial_values(TINY, name, shape, seed=7, start=start, stop=stop), whole[start:stop]
        )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # chunks drawn one by one rather than by a pool of threads
    try:
        assert torch.equal(initial_values(TINY, name, shape, seed=7), whole)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match=r"\[0, 2200001\) is not a slice"):
        initial_values(TINY, name, shape, seed=7, start=0, stop=n + 1)


@pytest.mark.parametrize("start", [0, 3, INIT_CHUNK + 7])
def test_writing_block_by_block_gives_the_whole_values_rounded_once(monkeypatch, start) -> None:
    """Parameters are written DRAW_BLOCK elements at a time: the same values as drawn whole."""
    import runner.model.transformer

    monkeypatch.setattr(
        runner.model.transformer, "DRAW_BLOCK", 2 * INIT_CHUNK
    )  # 2.2M elements: 2 blocks or more
    name, shape = "layers.0.feed_forward.w1.weight", (1100, 2000)
    whole = initial_values(TINY, name, shape, seed=7)
    drawn: list[tuple[int, int]] = []

    def spy(*args, start: int, stop: int, **kwargs) -> torch.Tensor:
        drawn.append((start, stop))
        return initial_values(*args, start=start, stop=stop, **kwargs)

    monkeypatch.setattr(runner.model.transformer, "initial_values", spy)
    out = torch.empty(whole.numel() - start, dtype=torch.bfloat16)
    write_initial_values(out, TINY, name, shape, seed=7, start=start)
    assert torch.equal(out, whole[start:].to(torch.bfloat16))
    assert drawn == [(start, 2 * INIT_CHUNK), (2 * INIT_CHUNK, whole.numel())]  # the host held one block


@pytest.mark.parametrize("dim", [0, 1])
def test_a_tensor_parallel_shard_gets_its_slice_of_the_whole_weight(monkeypatch, dim) -> None:
    """A cut pipeline stage writes its shards directly (runner/parallel/pipeline_tensor.py)."""
    import runner.model.transformer

    monkeypatch.setattr(runner.model.transformer, "DRAW_BLOCK", 7 * 300)  # bands of 7 rows: 43 of them
    name, shape = "layers.1.attention.wo.weight", (300, 200)
    whole = initial_values(TINY, name, shape, seed=5).view(shape)
    start, width = 120, 80
    out = torch.empty((width, 200) if dim == 0 else (300, width), dtype=torch.bfloat16)
    write_initial_shard(out, TINY, name, shape, seed=5, dim=dim, start=start)
    assert torch.equal(out, whole.narrow(dim, start, width).to(torch.bfloat16))


def test_meta_model_materialises_like_build_model() -> None:
    """to_empty + init_weights on a meta model gives build_model's weights, still tied."""
    ref = build_model(TINY, seed=3, device="cpu")
    model = build_model(TINY, device="meta").to_empty(device="cpu")
    model.init_weights(3)
    assert model.output.weight is model.tok_embeddings.weight
    for (name, p), (_, q) in zip(model.state_dict().items(), ref.state_dict().items(), strict=True):
        assert torch.equal(p, q), name
    assert torch.equal(model.rope_cos, ref.rope_cos)
    assert model.rope_cos.shape == (TINY.max_seq_len, TINY.d_model // TINY.n_head // 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_build_equals_the_fp32_build_cast_after(dtype: torch.dtype) -> None:
    """Built in 16 bits: DeepSpeed's cast of the fp32 model, bit for bit, RoPE still fp32, still tied."""
    cast_after = build_model(TINY, seed=3)
    cast_after.to(dtype)  # what the engine does to the parameters (it keeps the buffers fp32)
    built = build_model(TINY, seed=3, dtype=dtype)
    assert built.output.weight is built.tok_embeddings.weight
    for (name, p), (_, q) in zip(built.named_parameters(), cast_after.named_parameters(), strict=True):
        assert p.dtype == dtype, name
        assert torch.equal(p, q), name
    assert built.rope_cos.dtype == built.rope_sin.dtype == torch.float32
    assert torch.equal(built.rope_cos, build_model(TINY, seed=3).rope_cos)


def test_initial_loss_is_about_ln_vocab() -> None:
    """At init the prediction is near uniform: loss ~ ln(vocab)."""
    torch.manual_seed(0)
    model = build_model(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (4, 65))
    with torch.no_grad():
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).item()
    assert loss == pytest.approx(math.log(TINY.vocab_size), abs=0.1)


def test_one_step_reduces_loss() -> None:
    """One AdamW step on a fixed batch lowers that batch's loss."""
    torch.manual_seed(0)
    model = build_model(SMALL)
    tokens = torch.randint(0, SMALL.vocab_size, (4, 33))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = lm_loss(model(inputs), targets)
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = lm_loss(model(inputs), targets)
    assert after.item() < before.item() - 0.01


def test_recompute_modes_give_identical_loss_and_grads() -> None:
    """none, full, op-level selective and attention-core recompute: bitwise-equal loss and gradients."""
    torch.manual_seed(0)
    base = build_model(SMALL)
    tokens = torch.randint(0, SMALL.vocab_size, (2, 33))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    results = {}
    for mode in Recompute:
        model = build_model(dataclasses.replace(SMALL, activation_checkpointing=mode))
        model.load_state_dict(base.state_dict())
        model.train()
        loss = lm_loss(model(inputs), targets)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results[mode] = (loss.detach(), grads)
    ref_loss, ref_grads = results[Recompute.none]
    for mode in (Recompute.full, Recompute.selective, Recompute.attention):
        loss, grads = results[mode]
        assert loss.dtype == ref_loss.dtype
        assert torch.equal(loss, ref_loss), mode
        for name, g in grads.items():
            assert torch.equal(g, ref_grads[name]), (mode, name)


def test_gqa_equals_mha_with_repeated_kv_heads() -> None:
    """GQA with n_kv_head=2 is MHA whose k/v weights repeat each kv head n_head/2 times."""
    torch.manual_seed(0)
    gqa_cfg = dataclasses.replace(TINY, n_layer=2, n_kv_head=2)
    gqa = build_model(gqa_cfg)
    assert gqa.layers[0].attention.wk.weight.shape == (2 * 64, TINY.d_model)
    mha = build_model(dataclasses.replace(gqa_cfg, n_kv_head=None))
    state = gqa.state_dict()
    hs, rep = TINY.d_model // TINY.n_head, TINY.n_head // 2
    for key in list(state):
        if key.endswith(("wk.weight", "wv.weight")):
            w = state[key].view(2, hs, TINY.d_model)  # (nkv, hs, C)
            state[key] = w.repeat_interleave(rep, dim=0).reshape(-1, TINY.d_model)
    mha.load_state_dict(state)
    tokens = torch.randint(0, TINY.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(gqa(tokens), mha(tokens))


def test_attention_head_count_follows_sharded_projection() -> None:
    """Two tensor-parallel halves of wq/wk/wv (by heads) and wo (by input) sum to the whole."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(TINY, n_kv_head=2)
    full = Attention(cfg)
    C, hs = cfg.d_model, cfg.d_model // cfg.n_head
    x = torch.randn(2, 8, C)
    block = build_model(dataclasses.replace(cfg, n_layer=1))
    cos, sin = block.rope_cos[:8], block.rope_sin[:8]
    shards = []
    for rank in range(2):
        shard = Attention(cfg)
        q_rows = slice(rank * 2 * hs, (rank + 1) * 2 * hs)  # 2 of 4 query heads
        kv_rows = slice(rank * hs, (rank + 1) * hs)  # 1 of 2 kv heads
        shard.wq = torch.nn.Linear(C, 2 * hs, bias=False)
        shard.wk = torch.nn.Linear(C, hs, bias=False)
        shard.wv = torch.nn.Linear(C, hs, bias=False)
        shard.wo = torch.nn.Linear(2 * hs, C, bias=False)
        with torch.no_grad():
            shard.wq.weight.copy_(full.wq.weight[q_rows])
            shard.wk.weight.copy_(full.wk.weight[kv_rows])
            shard.wv.weight.copy_(full.wv.weight[kv_rows])
            shard.wo.weight.copy_(full.wo.weight[:, q_rows])
        shards.append(shard)
    with torch.no_grad():
        expected = full(x, cos, sin)
        summed = shards[0](x, cos, sin) + shards[1](x, cos, sin)  # the all-reduce
    torch.testing.assert_close(summed, expected)


def test_bad_shapes_fail_with_the_key() -> None:
    """Indivisible heads and too-long sequences are rejected, naming the config key."""
    with pytest.raises(ValueError, match=r"model\.n_head"):
        num_params(dataclasses.replace(TINY, n_head=3))
    with pytest.raises(ValueError, match=r"model\.n_kv_head"):
        Transformer(dataclasses.replace(TINY, n_kv_head=3))
    model = build_model(dataclasses.replace(TINY, n_layer=1, max_seq_len=8))
    with pytest.raises(ValueError, match=r"model\.max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    ("mode", "attention_calls", "ffn_calls"),
    [
        (Recompute.none, 1, 1),
        (Recompute.attention, 2, 1),
        (Recompute.selective, 2, 2),
        (Recompute.full, 2, 2),
    ],
)
def test_recompute_reruns_what_it_says(
    mode: Recompute,
    attention_calls: int,
    ffn_calls: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per layer and step: attention reruns only the attention core, full the whole block; selective
    reruns the block's Python too, its kept ops answered from what forward saved."""
    cfg = dataclasses.replace(TINY, n_layer=1, activation_checkpointing=mode)
    model = build_model(cfg)
    counts = {"sdpa": 0, "ffn": 0}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting_sdpa(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts["sdpa"] += 1
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_sdpa)
    # A pre-hook: non-reentrant checkpoint stops recomputing once it has every
    # saved tensor, before the module returns, so a post-hook would not fire.
    model.layers[0].feed_forward.register_forward_pre_hook(
        lambda *_: counts.__setitem__("ffn", counts["ffn"] + 1)
    )
    tokens = torch.randint(0, cfg.vocab_size, (1, 9))
    lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    assert counts == {"sdpa": attention_calls, "ffn": ffn_calls}
    # In eval mode nothing is checkpointed: one call each.
    counts.update(sdpa=0, ffn=0)
    model.eval()
    with torch.no_grad():
        model(tokens)
    assert counts == {"sdpa": 1, "ffn": 1}
