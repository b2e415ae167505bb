"""Memory estimators: model states against ZeRO's published figures, activations against what autograd keeps.

The activation tests measure runner/model/transformer.py's real blocks on CPU two ways:

- ``saved_tensors_hooks``: every tensor an op saves for backward, each storage counted once
  (by its data pointer), parameters and buffers excluded;
- liveness: every storage created during the forward that is still alive after it (weak
  references taken in a TorchDispatchMode). This also sees what ``torch.utils.checkpoint``
  (non-reentrant, as model.py uses it) keeps outside autograd's saved tensors: the inputs
  of the recomputed region.

Without recompute the two agree exactly; the estimate is checked against them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from runner.config import ModelConfig, Precision, Recompute
from runner.memory import (
    GB,
    TRANSIENT_ITEMS,
    BlockGraph,
    BlockShape,
    GiB,
    activation_items_per_layer,
    activation_items_total,
    activations_per_layer,
    activations_total,
    deepspeed_residuals,
    korthikanti_activation_items,
    korthikanti_activations_per_layer,
    model_block_shape,
    model_states,
    offload_host_buffers,
    zero12_held_elements,
)
from runner.model.shape import param_numels
from runner.model.transformer import (
    RMSNorm,
    TransformerBlock,
    build_model,
    checkpointed_block,
    lm_loss,
    rope_cache,
)

pytestmark = pytest.mark.unit

# Agreement required between estimate and measurement. The derivation matches the
# measurement byte for byte on torch 2.13 CPU; 1% leaves room for kernel padding only.
REL_TOL = 0.01


def sig3(x: float) -> float:
    """Round to 3 significant figures, as ZeRO's Figure 1 prints its numbers."""
    return float(f"{x:.3g}")


# --------------------------------------------------------------------------------------
# Model states: published figures
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "published_gb"),
    [(0, 120), (1, 31.4), (2, 16.6), (3, 1.88)],
)
def test_zero_figure_1(stage: int, published_gb: float) -> None:
    """ZeRO (arXiv 1910.02054) Fig. 1: 7.5B parameters, N_d = 64, mixed-precision Adam."""
    states = model_states(7_500_000_000, zero_stage=stage, dp=64, precision="bf16", optimizer="adamw")
    assert sig3(states.total / GB) == published_gb


def test_design_figures_7b_70b() -> None:
    """DESIGN.md: 16 B/param: 7B -> 112 GB, 70B -> 1120 GB; 70B on 64 GPUs, stage 3 -> 17.5 GB."""
    assert model_states(7_000_000_000, zero_stage=0, dp=1).total == 112 * GB
    assert model_states(70_000_000_000, zero_stage=0, dp=8).total == 1120 * GB
    assert model_states(70_000_000_000, zero_stage=3, dp=64).total == 17.5 * GB


def test_zero_stage_formulas_term_by_term() -> None:
    """Stage 1: (4 + 12/N_d)P, stage 2: (2 + 14/N_d)P, stage 3: 16P/N_d, split into the three terms."""
    p, nd = 1_000_000 * 64, 64
    s1 = model_states(p, zero_stage=1, dp=nd)
    s2 = model_states(p, zero_stage=2, dp=nd)
    s3 = model_states(p, zero_stage=3, dp=nd)
    assert (s1.params, s1.grads, s1.optimizer) == (2 * p, 2 * p, 12 * p // nd)
    assert (s2.params, s2.grads, s2.optimizer) == (2 * p, 2 * p // nd, 12 * p // nd)
    assert (s3.params, s3.grads, s3.optimizer) == (2 * p // nd, 2 * p // nd, 12 * p // nd)


@pytest.mark.parametrize(
    ("precision", "optimizer", "per_param"),
    [
        ("bf16", "adamw", (2, 2, 12)),  # 16-bit w, g; fp32 master + m + v
        ("fp16", "adamw", (2, 2, 12)),
        ("fp32", "adamw", (4, 4, 8)),  # no master copy: m + v
        ("bf16", "sgd", (2, 2, 8)),  # fp32 master + momentum
        ("fp32", "sgd", (4, 4, 4)),  # momentum only
    ],
)
def test_bytes_per_param_by_case(precision: str, optimizer: str, per_param: tuple[int, int, int]) -> None:
    """Each precision/optimizer pair holds the tensors its docstring names."""
    states = model_states(1000, zero_stage=0, dp=4, precision=precision, optimizer=optimizer)
    assert (states.params, states.grads, states.optimizer) == tuple(1000 * b for b in per_param)


def test_config_enums_are_accepted() -> None:
    """runner.config's str enums work where strings do."""
    assert model_states(10, zero_stage=0, dp=1, precision=Precision.fp32).params == 40


def test_uneven_partition_rounds_up() -> None:
    """A partition of P/N_d elements is ceil(P/N_d): DeepSpeed pads the last rank's."""
    assert model_states(10, zero_stage=3, dp=4).params == 3 * 2


def test_offload_optimizer_moves_states_and_fp32_grads_to_host() -> None:
    """ZeRO-Offload: only the 16-bit params stay on the device; host holds optimizer + fp32 grad partition."""
    p, nd = 6400, 64
    states = model_states(p, zero_stage=2, dp=nd, offload="optimizer")
    assert (states.params, states.grads, states.optimizer) == (2 * p, 0, 0)
    assert (states.host_grads, states.host_optimizer, states.host_params) == (4 * p // nd, 12 * p // nd, 0)
    full = model_states(p, zero_stage=3, dp=nd, offload="optimizer+params")
    assert full.total == 0
    assert full.host_total == (2 + 4 + 12) * p // nd


def test_zero12_gradients_are_held_whole_for_every_tensor_a_partition_touches() -> None:
    # Partitions of 5 elements over tensors [0,6) [6,7) [7,13): the middle rank touches all three.
    assert zero12_held_elements([6, 1, 6], dp=3) == 13
    assert zero12_held_elements([4, 4, 4], dp=2) == 8  # the straddling tensor, on both ranks
    assert zero12_held_elements([4, 4, 4], dp=1) == 12
    # The tiny model on 2 ranks, measured on DeepSpeed 0.19.8: rank 0 held 1,647,616
    # gradient elements, rank 1 1,758,464 (P/dp is 1,614,976).
    assert zero12_held_elements(param_numels(ModelConfig()), dp=2) == 1_758_464
    # The definition tensor by tensor, rank by rank, against the counting by bisection.
    draw = random.Random(0)
    for _ in range(300):
        numels = [draw.choice((0, 1, 2, 3, 7, 64, 1000)) for _ in range(draw.randint(1, 30))]
        dp = draw.randint(1, 40)
        partition = -(-sum(numels) // dp)
        starts = [sum(numels[:k]) for k in range(len(numels))]
        by_rank = [
            sum(
                n
                for s, n in zip(starts, numels, strict=True)
                if s < (r + 1) * partition and s + n > r * partition
            )
            for r in range(dp)
        ]
        assert zero12_held_elements(numels, dp=dp) == max(by_rank), (numels, dp)


def test_offload_host_buffers_are_deepspeeds_allocations() -> None:
    """ZeRO-Offload's own host buffers, by DeepSpeed 0.19.8's formulas (stage_1_and_2.py, stage3.py)."""
    p, nd, largest, held = 6400, 4, 1000, 2000  # held: whole tensors touching rank 0's partition
    common: dict[str, Any] = dict(dp=nd, largest_param=largest, held_params=held, accum_steps=2)
    # Stage 2, bf16: a bf16 copy of the partition, a staging buffer of the largest tensor,
    # the accumulated gradients of the held tensors; the fp32 master is in the optimizer term.
    assert offload_host_buffers(p, zero_stage=2, precision="bf16", offload="optimizer", **common) == {
        "param_buffer_of_bit16_for_cpu_offload_groups": 2 * p // nd,
        "temp_grad_buffer_for_cpu_offload": 2 * largest,
        "accumulated_grads_in_cpu": 2 * held,
    }
    # fp32 training: the fp32 partition the CPU optimizer steps is a second copy of the weights.
    fp32 = offload_host_buffers(p, zero_stage=2, precision="fp32", offload="optimizer", **common)
    assert fp32["fp32_master_copy"] == 4 * p // nd and fp32["accumulated_grads_in_cpu"] == 4 * held
    # No accumulation, or stage 1 (reduces only at the boundary): no accumulation buffer.
    no_accum = {**common, "accum_steps": 1}
    assert "accumulated_grads_in_cpu" not in offload_host_buffers(
        p, zero_stage=2, offload="optimizer", **no_accum
    )
    assert "accumulated_grads_in_cpu" not in offload_host_buffers(
        p, zero_stage=1, offload="optimizer", **common
    )
    # Stage 3: the 16-bit gradient partitions sit on the host, beside the fp32 ones.
    assert offload_host_buffers(p, zero_stage=3, precision="bf16", offload="optimizer+params", **common) == {
        "grad_partitions_flat_buffer": 2 * p // nd
    }
    assert offload_host_buffers(p, zero_stage=3, precision="fp32", offload="optimizer", **common) == {
        "fp32_master_copy": 4 * p // nd,
        "grad_partitions_flat_buffer": 4 * p // nd,
    }
    assert offload_host_buffers(p, zero_stage=2, offload="none", **common) == {}
    # Unknown held tensors: bounded by the partition plus a straddling tensor at each of its
    # boundaries (one at dp 2, two for a middle rank beyond).
    bound = offload_host_buffers(p, zero_stage=2, dp=nd, offload="optimizer", largest_param=largest)
    assert bound["accumulated_grads_in_cpu"] == 2 * (p // nd + 2 * largest)
    two = offload_host_buffers(p, zero_stage=2, dp=2, offload="optimizer", largest_param=largest)
    assert two["accumulated_grads_in_cpu"] == 2 * (p // 2 + largest)
    # The device keeps the staging buffer's twin (stages 1-2 only).
    device = deepspeed_residuals(p, zero_stage=2, dp=nd, offload="optimizer", largest_param=largest)
    assert device["temp_grad_buffer_for_gpu_offload"] == 2 * largest


# Host bytes the fullest of 2 CPU ranks held on DeepSpeed 0.19.8 (tiny, micro 4, accum 2), by name;
# rank 1 holds the larger accumulation buffer (runner.memory.zero12_held_elements).
MEASURED_OFFLOAD_HOST = {
    ("zero2", "fp32"): {
        "grads": 6_459_904,
        "optimizer": 12_919_808,
        "fp32_master_copy": 6_459_904,
        "param_buffer_of_bit16_for_cpu_offload_groups": 6_459_904,
        "temp_grad_buffer_for_cpu_offload": 704_512,
        "accumulated_grads_in_cpu": 7_033_856,  # rank 0: 6_591_488
    },
    ("zero3", "bf16"): {
        "params": 3_229_952,
        "grads": 6_459_904,
        "optimizer": 19_379_712,
        "grad_partitions_flat_buffer": 3_229_952,
    },
}


@pytest.mark.parametrize(("stage", "precision"), list(MEASURED_OFFLOAD_HOST))
def test_ledger_host_estimate_matches_deepspeeds_measured_host_bytes(stage: str, precision: str) -> None:
    """runner.metrics.ledger's host lines for the tiny model on 2 ranks: each within 0.1% of the measured
    bytes."""
    from runner.config import Offload, OptimizerName, ParallelConfig
    from runner.metrics.ledger import RankBatch, deepspeed_estimate, host_relative_errors

    tiny = ModelConfig()  # conf/model/tiny.yaml's shape
    zero3 = stage == "zero3"
    estimate = deepspeed_estimate(
        model=tiny,
        parallel=ParallelConfig(
            zero_stage=3 if zero3 else 2,
            offload_optimizer=Offload.cpu,
            offload_param=Offload.cpu if zero3 else Offload.none,
        ),
        precision=Precision(precision),
        optimizer=OptimizerName.adamw,
        batch=RankBatch(dp=2, micro_size=4, seq_len=128, accum_steps=2),
    )
    measured = MEASURED_OFFLOAD_HOST[(stage, precision)]
    assert set(estimate.host) == set(measured)
    terms = {name: measured.get(name, 0) for name in ("params", "grads", "optimizer")}
    errors = host_relative_errors(estimate.host, terms, measured)
    assert all(error is not None and abs(error) <= 1e-3 for error in errors.values()), errors


@pytest.mark.parametrize(
    ("stage", "offload", "message"),
    [(0, "optimizer", "stage 1, 2 or 3"), (2, "optimizer+params", "stage 3"), (1, "nvme", "offload")],
)
def test_offload_layouts_deepspeed_refuses_are_rejected(stage: int, offload: str, message: str) -> None:
    """Offload modes DeepSpeed does not run at that stage fail with the reason."""
    with pytest.raises(ValueError, match=message):
        model_states(100, zero_stage=stage, dp=2, offload=offload)


def test_residual_hook_validates_its_layout() -> None:
    """deepspeed_residuals takes the same layout as model_states and rejects a bad one."""
    assert isinstance(deepspeed_residuals(100, zero_stage=1, dp=2), dict)
    with pytest.raises(ValueError, match="zero_stage"):
        deepspeed_residuals(100, zero_stage=4, dp=2)


def test_units() -> None:
    """GB is decimal, GiB binary."""
    assert (GB, GiB) == (1e9, 1073741824)


# --------------------------------------------------------------------------------------
# Activations: Korthikanti et al. 2022 as published
# --------------------------------------------------------------------------------------

# GPT-3 175B as in Korthikanti et al. 2022, Table 3: a = 96, h = 12288, s = 2048, t = 8.
GPT3: dict[str, Any] = dict(seq_len=2048, micro_size=1, d_model=12288, n_heads=96)


def test_korthikanti_items_sum_to_equation_1_and_2() -> None:
    """The itemised derivation (Sec. 4.1) sums to eq. 1 and eq. 2 exactly."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    eq1 = sbh * (34 + 5 * a * s / h)
    assert korthikanti_activations_per_layer(**GPT3) == pytest.approx(eq1, rel=1e-12)
    for t in (2, 4, 8):
        eq2 = sbh * (10 + 24 / t + 5 * a * s / (h * t))
        assert korthikanti_activations_per_layer(**GPT3, tp=t) == pytest.approx(eq2, rel=1e-12)
    # Selective recompute: sbh(10 + 24/t); full: 2sbh (Sec. 5, Table 2).
    assert korthikanti_activations_per_layer(**GPT3, tp=8, recompute="selective") == pytest.approx(
        sbh * (10 + 24 / 8)
    )
    assert korthikanti_activations_per_layer(**GPT3, tp=8, recompute="full") == 2 * sbh


def test_korthikanti_gpt3_score_term_is_80() -> None:
    """The paper's point for GPT-3: 5as/h = 80, more than twice the 34 of everything else."""
    items = korthikanti_activation_items(**GPT3)
    score = sum(v for k, v in items.items() if k.startswith("attention.softmax"))
    assert score / (2048 * 12288) == 80


def test_korthikanti_flash_drops_scores_keeps_logsumexp() -> None:
    """Memory-efficient attention: 34 sbh plus an fp32 logsumexp of a*s*b values."""
    s, h, a = 2048, 12288, 96
    assert korthikanti_activations_per_layer(**GPT3, flash=True) == 34 * s * h + 4 * a * s


# --------------------------------------------------------------------------------------
# Activations: this project's block, estimate vs measurement
# --------------------------------------------------------------------------------------


class _Liveness(TorchDispatchMode):
    """Remembers every storage an op returns (latest per address) by weak reference."""

    def __init__(self, on_op: Callable[[_Liveness], None] | None = None) -> None:
        super().__init__()
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {}
        self.on_op = on_op

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                # A freed address can be reused: keep the latest storage seen there.
                self.refs[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        if self.on_op is not None:
            self.on_op(self)
        return out

    def alive_bytes(self, exclude: set[int]) -> int:
        """Bytes of recorded storages still alive, except those at `exclude` addresses."""
        return sum(n for ptr, (ref, n) in self.refs.items() if ptr not in exclude and not ref.expired())


def _ptrs(tensors: Iterator[torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def measure_kept_by_liveness(fn: Callable[[], torch.Tensor], exclude: set[int]) -> int:
    """Bytes created during fn() and still alive after it returns, minus its output and `exclude`."""
    mode = _Liveness()
    with mode:
        out = fn()
    return mode.alive_bytes(exclude | {out.untyped_storage().data_ptr()})


def measure_saved_by_hooks(fn: Callable[[], torch.Tensor], exclude: set[int]) -> int:
    """Bytes autograd saves for backward during fn(): each storage once, minus `exclude`."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


DTYPES = {torch.float32: 4, torch.bfloat16: 2}


def _cast_like_deepspeed(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast parameters only, keeping fp32 buffers (DeepSpeed 0.19.8 engine: "preserve fp32 buffers")."""
    for param in model.parameters():
        param.data = param.data.to(dtype)
    return model


SEQ, MICRO = 64, 2


def _block_case(
    dtype: torch.dtype, recompute: str, n_kv_head: int | None, *, compiled: bool = False
) -> tuple[Callable[[], torch.Tensor], set[int], ModelConfig]:
    cfg = ModelConfig(
        n_layer=1,
        n_head=4,
        n_kv_head=n_kv_head,
        d_model=128,
        ffn_hidden=344,
        activation_checkpointing=Recompute(recompute),
    )
    torch.manual_seed(0)
    block = TransformerBlock(cfg).to(dtype).train()
    if compiled:
        block.compile()  # as runner/engine/compile_blocks.py does with train.compile=true
    # RoPE tables stay fp32, as DeepSpeed keeps fp32 buffers under bf16 (see _cast_like_deepspeed).
    cos, sin = rope_cache(cfg, SEQ)
    x0 = torch.randn(MICRO, SEQ, cfg.d_model, dtype=dtype, requires_grad=True)

    def forward() -> torch.Tensor:
        x = x0 * 1.0  # the block input as a tensor created inside the measured region
        # What Transformer.forward does with each block under this recompute mode.
        return checkpointed_block(block, x, cos, sin, Recompute(recompute), training=True)

    exclude = _ptrs(iter([*block.parameters(), cos, sin, x0]))
    return forward, exclude, cfg


def _block_shape(
    cfg: ModelConfig, dtype: torch.dtype, *, flash: bool = True, graph: BlockGraph = "eager"
) -> BlockShape:
    block = model_block_shape(
        cfg, seq_len=SEQ, micro_size=MICRO, tp=1, bytes_per_elem=DTYPES[dtype], graph=graph
    )
    return dataclasses.replace(block, flash=flash)


def _estimate(cfg: ModelConfig, dtype: torch.dtype, recompute: str, flash: bool) -> dict[str, int]:
    return activation_items_per_layer(_block_shape(cfg, dtype, flash=flash), recompute)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
def test_cpu_sdpa_takes_the_flash_kernel(dtype: torch.dtype) -> None:
    """What `flash` means on CPU: causal SDPA without a mask runs the CPU flash kernel (no score matrix)."""
    q = torch.randn(2, 4, 64, 32, dtype=dtype, requires_grad=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert "FlashAttentionForCpu" in type(out.grad_fn).__name__


@pytest.mark.parametrize("n_kv_head", [None, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("recompute", ["none", "selective", "attention", "full"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
def test_block_activations_match_measurement(
    dtype: torch.dtype, recompute: str, n_kv_head: int | None
) -> None:
    """Estimate for runner/model/transformer.py's TransformerBlock vs the bytes it keeps for backward (CPU,
    flash)."""
    forward, exclude, cfg = _block_case(dtype, recompute, n_kv_head)
    estimate = _estimate(cfg, dtype, recompute, flash=True)
    kept = measure_kept_by_liveness(forward, exclude)
    assert sum(estimate.values()) == pytest.approx(kept, rel=REL_TOL), estimate
    if recompute == "none":
        # Both measures agree where autograd's saved tensors are all there is.
        assert measure_saved_by_hooks(forward, exclude) == kept


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
def test_block_activations_math_path_match_measurement(dtype: torch.dtype) -> None:
    """flash=False models torch's math SDPA (probabilities materialised, fp32 on CPU)."""
    forward, exclude, cfg = _block_case(dtype, "none", None)
    with sdpa_kernel(SDPBackend.MATH):
        kept = measure_saved_by_hooks(forward, exclude)
    estimate = _estimate(cfg, dtype, "none", flash=False)
    assert sum(estimate.values()) == pytest.approx(kept, rel=REL_TOL), estimate


@pytest.mark.parametrize("recompute", ["none", "attention"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
def test_compiled_block_activations_match_measurement(dtype: torch.dtype, recompute: str) -> None:
    """compiled=True vs what a torch.compile'd block saves: the norms' upcasts and silu are recomputed."""
    forward, exclude, cfg = _block_case(dtype, recompute, 2, compiled=True)
    estimate = activation_items_per_layer(_block_shape(cfg, dtype, graph="whole"), recompute)
    saved = measure_saved_by_hooks(forward, exclude)
    if recompute == "attention":
        # The compiled checkpoint also saves the CPU generator's state for its replay: a
        # constant 5 KB a layer, left out of the estimate.
        saved -= torch.get_rng_state().numel()
    assert sum(estimate.values()) == pytest.approx(saved, rel=REL_TOL), estimate
    eager = activations_per_layer(_block_shape(cfg, dtype), recompute)
    split = activations_per_layer(_block_shape(cfg, dtype, graph="split"), recompute)
    h, f, sb = cfg.d_model, cfg.ffn_hidden, SEQ * MICRO
    assert eager - split == 8 * sb * h  # the norms' upcast and normed value, recomputed
    assert split - sum(estimate.values()) == DTYPES[dtype] * sb * f  # silu's output, too


def test_project_block_vs_korthikanti_in_bf16() -> None:
    """The adapted constant: bf16 with flash, sbh(26 + 8f/h) + small terms, vs the paper's 34 sbh."""
    s, b, h, a, f = 2048, 1, 4096, 32, 11008
    items = activation_items_per_layer(
        BlockShape(seq_len=s, micro_size=b, d_model=h, n_heads=a, ffn_hidden=f, flash=True, bytes_per_elem=2)
    )
    small = s * b * (8 + 4 * a)  # rstd, logsumexp
    assert sum(items.values()) == s * b * h * 26 + 8 * s * b * f + small


def test_tensor_parallel_splits_only_per_head_and_ffn_tensors() -> None:
    """Norm tensors and the inputs of column-parallel linears stay whole on every TP rank (eq. 2)."""
    common: dict[str, Any] = dict(
        seq_len=128, micro_size=2, d_model=256, n_heads=8, ffn_hidden=688, flash=True
    )
    one = activation_items_per_layer(BlockShape(**common, tp=1))
    two = activation_items_per_layer(BlockShape(**common, tp=2))
    replicated = {k for k in one if "norm" in k or k in ("attention.input", "feed_forward.input")}
    for key in one:
        expected = one[key] if key in replicated else one[key] / 2
        assert two[key] == expected, key
    with pytest.raises(ValueError, match="tp=3"):
        BlockShape(**common, tp=3)


def test_aliased_attention_output_counts_once() -> None:
    """attn_out_aliased drops wo.input's copy, and only that."""
    common: dict[str, Any] = dict(seq_len=128, micro_size=2, d_model=256, n_heads=8, flash=True)
    copy = activations_per_layer(BlockShape(**common))
    alias = activations_per_layer(BlockShape(**common, attn_out_aliased=True))
    assert copy - alias == 2 * 128 * 2 * 256


# --------------------------------------------------------------------------------------
# Activations: whole model (blocks + embedding, final norm, head, fp32 loss)
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _peak_tracker(exclude: set[int]) -> Iterator[dict[str, Any]]:
    result: dict[str, Any] = {"peak": 0}

    def on_op(mode: _Liveness) -> None:
        result["peak"] = max(result["peak"], mode.alive_bytes(exclude))

    mode = _Liveness(on_op)
    result["mode"] = mode
    with mode:
        yield result


@pytest.mark.parametrize("recompute", ["none", "selective", "attention", "full"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
def test_model_activations_match_measurement(dtype: torch.dtype, recompute: str) -> None:
    """activation_items_total's kept items vs what a 2-layer model keeps after forward + fp32 loss."""
    cfg = ModelConfig(
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        d_model=128,
        ffn_hidden=344,
        vocab_size=1024,
        max_seq_len=SEQ,
        activation_checkpointing=Recompute(recompute),
    )
    torch.manual_seed(0)
    model = _cast_like_deepspeed(build_model(cfg), dtype).train()
    tokens0 = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1))
    exclude = _ptrs(iter([*model.parameters(), *model.buffers(), tokens0]))

    def forward() -> torch.Tensor:
        tokens = tokens0[:, :-1].clone()  # ids and targets as tensors created in the region
        targets = tokens0[:, 1:].clone()
        return lm_loss(model(tokens), targets)

    with _peak_tracker(exclude) as tracked:
        loss = forward()
    kept = tracked["mode"].alive_bytes(exclude | {loss.untyped_storage().data_ptr()})

    block = _block_shape(cfg, dtype)
    items = activation_items_total(
        block, n_layers=cfg.n_layer, vocab_size=cfg.vocab_size, recompute=recompute
    )
    estimate_kept = sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)
    assert estimate_kept == pytest.approx(kept, rel=REL_TOL), items
    if recompute == "none":
        # The forward's peak is at the loss: everything kept + the logits (+ their fp32 copy).
        # Other transients (a block's temporaries, the loss scalar) stay under 5% here.
        at_loss = items["transient.logits"] + items["transient.logits_fp32"]
        assert estimate_kept + at_loss == pytest.approx(tracked["peak"], rel=0.05)


@pytest.mark.parametrize("tiles", [3, 8])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
def test_a_loss_in_pieces_keeps_no_logits_and_peaks_at_one_piece(dtype: torch.dtype, tiles: int) -> None:
    """model.loss_tiles: what the model keeps after forward (no V-wide tensor), and the forward's
    and backward's peaks at the loss (one piece's logits, log-probabilities and gradients), each
    against activation_items_total. 3 pieces of a 64-token sequence are 22, 22 and 20 tokens."""
    cfg = ModelConfig(
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        d_model=128,
        ffn_hidden=344,
        vocab_size=1024,
        max_seq_len=SEQ,
        loss_tiles=tiles,
    )
    torch.manual_seed(0)
    model = _cast_like_deepspeed(build_model(cfg), dtype).train()
    tokens0 = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1))
    exclude = _ptrs(iter([*model.parameters(), *model.buffers(), tokens0]))
    tokens, targets = tokens0[:, :-1].clone(), tokens0[:, 1:].clone()
    exclude |= _ptrs(iter([tokens, targets]))

    with _peak_tracker(exclude) as forward_peak:
        loss = model(tokens, targets)
    kept = forward_peak["mode"].alive_bytes(exclude | {loss.untyped_storage().data_ptr()})
    items = activation_items_total(_block_shape(cfg, dtype), n_layers=cfg.n_layer, vocab_size=cfg.vocab_size)
    assert "loss.log_probs_fp32" not in items
    estimate_kept = sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)
    # The targets are the caller's tensor, kept by reference: counted by the plan, not allocated here.
    assert estimate_kept - items["loss.targets"] == pytest.approx(kept, rel=REL_TOL), items
    whole = activation_items_total(
        _block_shape(dataclasses.replace(cfg, loss_tiles=1), dtype),
        n_layers=cfg.n_layer,
        vocab_size=cfg.vocab_size,
    )
    assert whole["loss.log_probs_fp32"] == 4 * MICRO * SEQ * cfg.vocab_size
    piece = (
        items["transient.logits"] + items["transient.logits_fp32"] + items["transient.piece_log_probs_fp32"]
    )
    assert estimate_kept - items["loss.targets"] + piece == pytest.approx(forward_peak["peak"], rel=0.05)
    print(
        f"{dtype}, {tiles} pieces: kept {kept} B (estimated {estimate_kept - items['loss.targets']}), "
        f"forward peak {forward_peak['peak']} B (estimated {estimate_kept - items['loss.targets'] + piece}); "
        f"whole: log-probabilities alone {whole['loss.log_probs_fp32']} B"
    )


@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
def test_final_norms_backward_working_set_matches_measurement(dtype: torch.dtype) -> None:
    """transient.final_norm_backward: the most bytes the final RMSNorm's backward holds at once,
    beyond what forward saved, in fp32 and bf16 alike (the statistics are fp32). The plan
    adds it to what ZeRO 1-2's bucket allocates once the head's backward is done."""
    cfg = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=128, ffn_hidden=344, vocab_size=1024)
    norm = RMSNorm(cfg.d_model).to(dtype)
    x = torch.randn(MICRO, SEQ, cfg.d_model, dtype=dtype, requires_grad=True)
    grad = torch.randn(MICRO, SEQ, cfg.d_model, dtype=dtype)
    out = norm(x)
    with _peak_tracker(_ptrs(iter([x, grad, norm.weight]))) as tracked:
        out.backward(grad)
    items = activation_items_total(_block_shape(cfg, dtype), n_layers=cfg.n_layer, vocab_size=cfg.vocab_size)
    # Beyond the five sbh tensors: a few (b, s, 1) statistics' gradients and the gain's.
    assert items["transient.final_norm_backward"] == pytest.approx(tracked["peak"], rel=0.02)


def test_logits_dominate_for_a_large_vocabulary() -> None:
    """Llama 3.2 1B shape, bf16, full recompute: the V-wide loss terms outweigh all 16 layers' checkpoints."""
    block = BlockShape(
        seq_len=2048, micro_size=1, d_model=2048, n_heads=32, n_kv_heads=8, ffn_hidden=8192, flash=True
    )
    items = activation_items_total(block, n_layers=16, vocab_size=128256, recompute="full")
    vocab_terms = items["loss.log_probs_fp32"] + items["transient.logits"] + items["transient.logits_fp32"]
    assert vocab_terms > 10 * items["blocks"]
    assert math.isclose(vocab_terms / (2048 * 128256), 4 + 2 + 4)


def test_recompute_transient_counts_one_rebuilt_layer() -> None:
    """With full recompute, backward rebuilds one block: the transient is one layer without recompute."""
    block = BlockShape(seq_len=256, micro_size=1, d_model=256, n_heads=4, flash=True)
    items = activation_items_total(block, n_layers=4, vocab_size=256, recompute="full")
    assert items["transient.recompute_layer"] == activations_per_layer(block)


@pytest.mark.parametrize("vocab_size", [256, 32], ids=["vocab_2h", "vocab_h/4"])
@pytest.mark.parametrize("recompute", ["none", "selective", "attention", "full"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp32", "bf16"])
def test_total_is_close_to_measured_forward_backward_peak(
    dtype: torch.dtype, recompute: str, vocab_size: int
) -> None:
    """activations_total vs the activation peak over forward + backward of a 4-layer model.

    Without full recompute the peak is where backward starts: everything kept, with the
    loss's two fp32 gradients (nll_loss's and log_softmax's). The estimate is within 0.03%
    of it, over by the int64 targets, already freed then. With a vocabulary of h/4 the
    peak is in the final norm's backward instead (runner.memory.after_the_head; 1-6% under
    without it), where the tied head's weight gradient (V x h, the plan's own line) is live
    too: with it the estimate is within 0.4%. With full recompute the peak is
    in a rebuilt block, beside activation gradients in flight, which the estimate leaves
    out: it reads low there (7% in fp32, 1% in bf16); with op-level selective recompute too
    (8% in fp32, 4-7% in bf16). Parameter gradients are excluded
    (their buffers exist before the step, as DeepSpeed's do).
    """
    cfg = ModelConfig(
        n_layer=4,
        n_head=4,
        n_kv_head=2,
        d_model=128,
        ffn_hidden=344,
        vocab_size=vocab_size,
        max_seq_len=SEQ,
        activation_checkpointing=Recompute(recompute),
    )
    torch.manual_seed(0)
    model = _cast_like_deepspeed(build_model(cfg), dtype).train()
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    tokens0 = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    exclude = _ptrs(iter([*model.parameters(), *model.buffers(), *grads, tokens0]))
    with _peak_tracker(exclude) as tracked:
        lm_loss(model(tokens0[:, :-1].clone()), tokens0[:, 1:].clone()).backward()
    total = activations_total(
        _block_shape(cfg, dtype), n_layers=cfg.n_layer, vocab_size=cfg.vocab_size, recompute=recompute
    )
    if recompute in ("full", "selective"):
        assert 0.90 * tracked["peak"] <= total <= tracked["peak"]
    elif vocab_size < cfg.d_model:
        tied_head_gradient = DTYPES[dtype] * vocab_size * cfg.d_model
        assert total + tied_head_gradient == pytest.approx(tracked["peak"], rel=5e-3)
    else:
        assert total == pytest.approx(tracked["peak"], rel=1e-3)


def test_wholesale_bf16_cast_adds_the_rope_table_copies() -> None:
    """model.to(bf16) also casts the RoPE buffers; apply_rope's cos.float()/sin.float() then save
    4 fp32 (s, hs/2) copies per layer, 8*s*hs bytes: the one case the estimate leaves out."""
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=128, ffn_hidden=344, vocab_size=256, max_seq_len=SEQ)
    torch.manual_seed(0)
    tokens0 = torch.randint(0, cfg.vocab_size, (MICRO, SEQ + 1))

    def kept_by(model: torch.nn.Module) -> int:
        exclude = _ptrs(iter([*model.parameters(), *model.buffers(), tokens0]))
        return measure_saved_by_hooks(
            lambda: lm_loss(model(tokens0[:, :-1].clone()), tokens0[:, 1:].clone()), exclude
        )

    like_deepspeed = kept_by(_cast_like_deepspeed(build_model(cfg), torch.bfloat16))
    wholesale = kept_by(build_model(cfg).to(torch.bfloat16))
    assert wholesale - like_deepspeed == cfg.n_layer * 8 * SEQ * (cfg.d_model // cfg.n_head)


def test_the_estimators_take_runner_configs_enums_or_their_plain_values():
    """Notebooks pass plain strings and ints; the typed config passes its enums: the same bytes."""
    from runner.config import OffloadPlacement, OptimizerName, ZeroStage

    plain = model_states(10**9, zero_stage=3, dp=8, precision="bf16", optimizer="adamw", offload="optimizer")
    typed = model_states(
        10**9,
        zero_stage=ZeroStage.zero3,
        dp=8,
        precision=Precision.bf16,
        optimizer=OptimizerName.adamw,
        offload=OffloadPlacement.optimizer,
    )
    assert plain == typed and typed.host_optimizer == 12 * 10**9 // 8
    block = BlockShape(seq_len=128, micro_size=2, d_model=256, n_heads=4)
    assert activations_per_layer(block, "selective") == activations_per_layer(block, Recompute.selective)
    with pytest.raises(ValueError, match=r"offload='nvme' is not one of none, optimizer, optimizer\+params"):
        model_states(10, zero_stage=2, dp=1, offload="nvme")
