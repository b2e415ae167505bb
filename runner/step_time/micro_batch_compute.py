"""One micro-batch's compute on the fullest rank, priced from the device's calibration.

runner/step_time/calibrated_terms.py turns these seconds into the step's ``gemm``, ``attention``,
``elementwise``, ``dispatch`` and ``recompute`` terms. Every rate is the device's own, at the
shape the run will use (runner/step_time/measured/figures.py). On the fullest rank (the pipeline stage
with most layers, holding the output head), with ``T = micro x seq`` tokens per micro-batch:

- GEMMs: every linear layer's three GEMMs (forward X W, backward dY W^T and X^T dY; Narayanan
  et al. 2021, arXiv 2104.04473, Sec. 5.1, the 2:4 forward:backward FLOPs) at (T, in, out), the
  block matrices cut by tensor parallelism as runner/parallel/tensor.py cuts them (q, k, v, w1, w3
  by output columns, wo, w2 by input rows, the head by vocabulary), at the measured FLOP/s of
  each shape.
- attention: causal ``scaled_dot_product_attention`` (the kernel runner/model/transformer.py
  calls) forward and backward at (micro, heads / tp, seq, head_dim), measured.
- elementwise: the memory-bound kernels around them (RMSNorm, RoPE, SwiGLU's gate, the
  residual adds, the cross-entropy over the vocabulary). Measured where the calibration has it
  (runner/step_time/measured/block_timing.py): the block's own non-GEMM code at the run's
  shape, eager or, with ``train.compile``, under torch.compile, less its dispatch floor; the
  loss at (tokens, vocab / tp). Else bytes read and written over the copy bandwidth of the whole pass's bytes:
  eager, every kernel's bytes as autograd runs them (runner/step_time/eager_traffic.py counts them on
  meta tensors, fp32 casts and autograd's sums included); compiled, each op's tensors read and
  written once in the compute dtype (:data:`NORM_AND_RESIDUAL` ...), backward twice the forward;
  and the words say it is not timed at this shape.
- dispatch: the same non-GEMM ops at a trivial shape: what launching them costs whatever
  their size. Else :data:`OPS_PER_LAYER` eager ops per block at one op's measured cost (a CPU's),
  labelled as not measured at this shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.config import ModelConfig
from runner.layout import Layout
from runner.memory_model.peak_lines import layers_per_stage
from runner.model.op_recompute import RECOMPUTED_MATMULS
from runner.model.shape import n_kv_head
from runner.rules import mlp_tile_count
from runner.step_time.eager_traffic import block_rest_traffic, loss_traffic
from runner.step_time.measured.figures import Calibration
from runner.step_time.workload import Workload

# Elements each token reads plus writes in one block's memory-bound forward kernels
# (runner/model/transformer.py), by the width they run at: two RMSNorms (pow, mean, scale,
# gain: 7 h each) and two residual adds (3 h each) at d_model; RoPE on q and k (4 multiplies,
# a subtract and an add of halves, the concatenation: 9 elements per channel) and the
# attention output's transpose copy (2) at their widths; SwiGLU's silu and product (5 f).
NORM_AND_RESIDUAL = 2 * 7 + 2 * 3  # x d_model
ROPE = 9  # x (q width + k width)
TRANSPOSE = 2  # x attention width
SWIGLU = 5  # x ffn width
BACKWARD_ELEMENTS = 2.0  # backward over forward bytes of the memory-bound kernels
# Eager ops of one block's forward (each with its backward): norms 2 x 6, q/k/v/o and
# w1/w2/w3 projections 7, head views and transposes 6, RoPE 2 x 9, attention 1, residual
# adds 2, SwiGLU 2, reshapes 2.
OPS_PER_LAYER = 50


def _gemm_shapes(workload: Workload, layout: Layout, tokens: int) -> list[tuple[str, int, int, int, int]]:
    """(name, count, M, K, N) of every GEMM of one micro-batch's forward on the fullest rank."""
    model, tp = workload.model, layout.tp
    h, f, v = model.d_model, model.ffn_hidden, model.vocab_size
    kv = h * n_kv_head(model) // model.n_head
    layers = layers_per_stage(model.n_layer, layout.pp)
    return [
        ("wq", layers, tokens, h, h // tp),
        ("wk", layers, tokens, h, kv // tp),
        ("wv", layers, tokens, h, kv // tp),
        ("wo", layers, tokens, h // tp, h),
        ("w1", layers, tokens, h, f // tp),
        ("w3", layers, tokens, h, f // tp),
        ("w2", layers, tokens, f // tp, h),
        ("head", 1, tokens, h, v // tp),
    ]


@dataclass(frozen=True)
class MicroCompute:
    """One micro-batch's compute on the fullest rank, forward and backward, in seconds."""

    gemm_forward: float
    gemm_backward: float
    attention_forward: float
    attention_backward: float
    elementwise_forward: float
    dispatch: float  # forward and backward
    loss_forward: float = 0.0  # the output head's GEMM and the cross-entropy, forward only
    # op-level selective recompute's rerun: the matmuls it does not keep (runner/model/op_recompute.py)
    # and the blocks' memory-bound kernels, forward only
    reran_gemm_forward: float = 0.0
    block_elementwise_forward: float = 0.0
    # the MLP in pieces (model.mlp_tiles): its GEMMs at a piece's shape and SwiGLU, forward only
    mlp_forward_in_pieces: float = 0.0
    in_place: float = 1.0  # the blocks' parts scaled by a block timed whole (``_in_place``)
    elementwise_words: str = ""  # where the elementwise and dispatch figures came from
    dispatch_words: str = ""


def rank_seq_len(workload: Workload, layout: Layout) -> int:
    """Tokens of each sample a rank runs outside attention: seq / sp (runner/parallel/sequence.py)."""
    return workload.seq_len // layout.sp


def _attention_from_gemms(
    calibration: Calibration, batch_heads: int, seq: int, head_dim: int
) -> tuple[float, float] | None:
    """Attention without a measurement (a calibration file that has none): its FLOPs at the median
    of the recorded GEMM rates. Causal attention computes half of the 4 s^2 d per head of QK^T and
    PV forward (FlashAttention-2, Dao 2023, arXiv 2307.08691, Sec. 3.1: the masked blocks are
    skipped); backward 2.5 times the forward FLOPs (same paper, Sec. 4.1)."""
    rates = sorted(rate[0] for rate in calibration.gemms.values())
    if not rates:
        return None
    rate = rates[len(rates) // 2] * calibration.compute_scale
    forward = 2.0 * batch_heads * seq * seq * head_dim / rate
    return forward, 2.5 * forward


def _reran_gemm_forward(workload: Workload, layout: Layout, calibration: Calibration, tokens: int) -> float:
    """Forward seconds of one micro-batch's matmuls that op-level selective recompute runs again."""
    seconds = 0.0
    for name, count, m, k, n in _gemm_shapes(workload, layout, tokens):
        rates = calibration.gemm(m, k, n) if name in RECOMPUTED_MATMULS else None
        if rates is not None:
            seconds += count * 2.0 * m * k * n / rates[0]
    return seconds


def _mlp_forward_in_pieces(
    workload: Workload, layout: Layout, calibration: Calibration, tokens: int, elementwise: float
) -> float | None:
    """Forward seconds of one micro-batch's MLPs run in ``model.mlp_tiles`` pieces (0: whole).

    DeepSpeed's TiledMLP runs each piece's forward again in backward
    (deepspeed/runtime/sequence_parallel/ulysses_sp.py ``TiledMLP.backward``): w1, w3 and w2 at
    (piece, in, out), at the rate measured at that shape, times the pieces; and SwiGLU's silu and
    product, their share of the block's memory-bound forward (``elementwise``: one block's) by the
    bytes each kernel moves (:data:`SWIGLU` of the per-token elements). None: a figure is missing.
    """
    model, tp = workload.model, layout.tp
    tiles = mlp_tile_count(model, tokens=tokens)
    if tiles == 1:
        return 0.0
    piece = -(-tokens // tiles)  # the pieces are this long but the last (runner.rules.mlp_tiles)
    seconds = 0.0
    for name, count, _, k, n in _gemm_shapes(workload, layout, piece):
        if name not in ("w1", "w3", "w2"):
            continue
        rates = calibration.gemm(piece, k, n)
        if rates is None:
            return None
        seconds += count * 2.0 * tokens * k * n / rates[0]  # every token once, at a piece's rate
    h, f = model.d_model, model.ffn_hidden
    kv = h * n_kv_head(model) // model.n_head
    per_token = NORM_AND_RESIDUAL * h + (ROPE * (h + kv) + TRANSPOSE * h + SWIGLU * f) / tp
    swiglu_share = SWIGLU * f / tp / per_token
    layers = layers_per_stage(model.n_layer, layout.pp)
    return seconds + layers * elementwise * swiglu_share


def _gemm_seconds(
    workload: Workload, layout: Layout, calibration: Calibration, tokens: int
) -> tuple[list[float], list[float]] | None:
    """(forward, backward) seconds of one micro-batch's GEMMs: [the blocks', the head's]."""
    forward, backward = [0.0, 0.0], [0.0, 0.0]
    for name, count, m, k, n in _gemm_shapes(workload, layout, tokens):
        rates = calibration.gemm(m, k, n)
        if rates is None:
            return None
        flops, where = 2.0 * m * k * n, int(name == "head")
        forward[where] += count * flops / rates[0]
        backward[where] += count * (flops / rates[1] + flops / rates[2])
    return forward, backward


def _in_place(workload: Workload, layout: Layout, calibration: Calibration, parts: float) -> float:
    """One block timed whole (runner/step_time/measured/block_timing.py) over the sum of its parts ``parts``:
    what the parts take together, in place; 1 where no block was timed (a file's device, tp > 1)."""
    model = workload.model
    if layout.tp > 1 or parts <= 0:
        return 1.0
    seq = rank_seq_len(workload, layout)
    timed = calibration.block_seconds(
        layout.micro_size, seq, model.d_model, model.n_head, n_kv_head(model), model.ffn_hidden
    )
    return 1.0 if timed is None else timed / parts


def gemm_caveats(workload: Workload, layout: Layout, calibration: Calibration, micro: MicroCompute) -> str:
    """What the gemm line rests on beyond each shape's own measurement: a CPU's capped shapes
    (runner/hardware/calibrate.py ``gemm_rates``), and the blocks' in-place scale or its absence."""
    words = ""
    cap = calibration.gemm_cap_flops
    tokens = layout.micro_size * rank_seq_len(workload, layout)
    if cap is not None:
        over = [name for name, _, m, k, n in _gemm_shapes(workload, layout, tokens) if 2.0 * m * k * n > cap]
        if over:
            words += (
                f"; {', '.join(over)} above {cap:.3g} FLOP: measured with M or N halved to under it, "
                "that rate applied to the full FLOPs"
            )
    model = workload.model
    shape = (
        layout.micro_size,
        rank_seq_len(workload, layout),
        model.d_model,
        model.n_head,
        n_kv_head(model),
        model.ffn_hidden,
    )
    if micro.in_place != 1.0:
        words += f"; blocks' parts x {micro.in_place:.3g}, one block timed whole"
    elif layout.tp == 1 and calibration.block_too_large(shape):
        words += (
            f"; a block above {calibration.block_cap_params:.3g} parameters is not timed whole on a CPU: "
            "parts unscaled"
        )
    return words


def micro_compute(workload: Workload, layout: Layout, calibration: Calibration) -> MicroCompute | None:
    """One micro-batch's GEMMs, attention, memory-bound kernels and dispatch on the fullest rank,
    the blocks' parts scaled to a block timed whole (None: a figure is missing)."""
    model, tp = workload.model, layout.tp
    tokens = layout.micro_size * rank_seq_len(workload, layout)
    gemms = _gemm_seconds(workload, layout, calibration, tokens)
    layers = layers_per_stage(model.n_layer, layout.pp)
    head_dim = model.d_model // model.n_head
    # Under sequence parallelism each rank attends over the whole sequence with heads / sp
    # (runner/parallel/sequence.py); its other work runs on seq / sp tokens.
    heads = model.n_head // (tp * layout.sp)
    attention = calibration.attention_s(layout.micro_size, heads, workload.seq_len, head_dim)
    if attention is None:
        attention = _attention_from_gemms(calibration, layout.micro_size * heads, workload.seq_len, head_dim)
    if gemms is None or attention is None:
        return None
    rest = _rest(workload, layout, calibration, layers)
    if rest is None:
        return None
    (block_f, head_f), (block_b, head_b) = gemms
    block_rest, floor, head_elementwise, elementwise_words, dispatch_words = rest
    one_block = (block_f + block_b) / layers + sum(attention) + block_rest
    scale = _in_place(workload, layout, calibration, one_block)
    elementwise = (block_rest - floor) / (1 + BACKWARD_ELEMENTS)  # one block's forward share
    mlp_pieces = _mlp_forward_in_pieces(workload, layout, calibration, tokens, elementwise)
    if mlp_pieces is None:
        return None
    return MicroCompute(
        gemm_forward=head_f + scale * block_f,
        gemm_backward=head_b + scale * block_b,
        attention_forward=scale * layers * attention[0],
        attention_backward=scale * layers * attention[1],
        elementwise_forward=scale * layers * elementwise + head_elementwise,
        dispatch=scale * layers * floor,
        loss_forward=head_f + head_elementwise,
        reran_gemm_forward=scale * _reran_gemm_forward(workload, layout, calibration, tokens),
        block_elementwise_forward=scale * layers * elementwise,
        mlp_forward_in_pieces=scale * mlp_pieces,
        in_place=scale,
        elementwise_words=elementwise_words,
        dispatch_words=dispatch_words,
    )


def _rank_block(workload: Workload, layout: Layout) -> ModelConfig:
    """One block as a tensor-parallel rank holds it: its heads, key/value heads and ffn columns
    (each head keeps the model's width: ``non_gemm_step``'s ``head_dim``)."""
    model, tp = workload.model, layout.tp
    return ModelConfig(
        name="block",
        n_layer=1,
        n_head=model.n_head // tp,
        n_kv_head=max(1, n_kv_head(model) // tp),
        d_model=model.d_model,
        ffn_hidden=model.ffn_hidden // tp,
        rope_theta=model.rope_theta,
        norm_eps=model.norm_eps,
    )


def _rest(
    workload: Workload, layout: Layout, calibration: Calibration, layers: int
) -> tuple[float, float, float, str, str] | None:
    """One block's non-GEMM part forward + backward, its dispatch floor (both seconds), the
    cross-entropy's forward share, and in words where each came from (None: a figure is missing).

    Measured (runner/step_time/measured/block_timing.py): the block's own non-GEMM code at the run's shape,
    eager or compiled as the run asks, its floor the same ops at a trivial shape; the loss at
    (tokens, vocab / tp). Not measured on the device (a calibration file without them): priced
    by :func:`_block_rest_over_bandwidth` and :func:`_loss_forward`, and the term says so."""
    model, tp = workload.model, layout.tp
    h, f = model.d_model, model.ffn_hidden
    heads, kv_heads = model.n_head // tp, max(1, n_kv_head(model) // tp)
    shape = (layout.micro_size, rank_seq_len(workload, layout), h, heads, kv_heads, f // tp)
    mode = "compiled" if workload.compiled else "eager"
    measured = calibration.rest_seconds(*shape, compiled=workload.compiled)
    missing = []
    if measured is not None:
        block_rest, floor, how = measured
        block_words = f"the block's non-GEMM part {mode}, {how}"
        dispatch_words = f"its ops at a trivial shape ({how.split(' at ')[0]}): the floor their dispatch sets"
    else:
        priced = _block_rest_over_bandwidth(workload, layout, calibration, layers)
        if priced is None:
            return None
        block_rest, floor, block_words, dispatch_words = priced
        missing.append(f"the block's non-GEMM part ({mode})")
    loss = _loss_forward(workload, layout, calibration)
    if loss is None:
        return None
    head, loss_words, loss_measured = loss
    if not loss_measured:
        missing.append("the cross-entropy")
    words = f"{block_words}; {loss_words}"
    if missing and calibration.measure is None:
        words += f"; {' and '.join(missing)} not measured on this device ({calibration.device})"
    return block_rest, floor, head, words, dispatch_words


def _block_rest_over_bandwidth(
    workload: Workload, layout: Layout, calibration: Calibration, layers: int
) -> tuple[float, float, str, str] | None:
    """One block's non-GEMM part forward + backward and its dispatch floor (seconds), and the
    words for each, where the calibration did not time them (None: no copy bandwidth).

    Their bytes over the copy bandwidth, eager's as its kernels move them (counted on meta tensors,
    runner/step_time/eager_traffic.py), a compiled block's each op's tensors once in the compute dtype
    (:data:`NORM_AND_RESIDUAL` ...), :data:`OPS_PER_LAYER` eager ops at one op's measured dispatch
    (a CPU's; a GPU's queue hides it)."""
    model, tp = workload.model, layout.tp
    tokens = layout.micro_size * rank_seq_len(workload, layout)
    elem = workload.precision.bytes
    h, f = model.d_model, model.ffn_hidden
    kv = h * n_kv_head(model) // model.n_head
    # A CPU runs each op as it is dispatched; a GPU queues kernels while the host dispatches
    # the next, so the host's dispatch time hides behind them (a GPU's calibration has threads 0).
    op_s = (calibration.op_seconds() or 0.0) if calibration.threads else 0.0
    per_token = NORM_AND_RESIDUAL * h + (ROPE * (h + kv) + TRANSPOSE * h + SWIGLU * f) / tp
    fused_forward = tokens * per_token * elem
    if workload.compiled:
        block_bytes = fused_forward * (1 + BACKWARD_ELEMENTS)
        traffic = "compiled: each op's tensors read and written once in the compute dtype"
    else:
        counted, kernels = block_rest_traffic(
            _rank_block(workload, layout),
            layout.micro_size,
            rank_seq_len(workload, layout),
            workload.precision.torch_dtype_name,
            h // model.n_head,
        )
        block_bytes = float(counted)
        traffic = f"eager: {kernels} kernels' bytes, counted (runner/step_time/eager_traffic.py)"
    # The rate of a copy as large as the whole forward's tensors: they stream through the caches
    # once, each written by one kernel and read by the next after others ran between (eager's
    # further passes over them go at the same rate).
    block_rate = calibration.copy_rate(layers * fused_forward)
    if block_rate is None:
        return None
    floor = OPS_PER_LAYER * op_s
    block_rest = block_bytes / block_rate + floor
    block_words = f"norms, RoPE, SwiGLU, residuals {traffic}, over copy bandwidth, not timed at this shape"
    dispatch_words = f"{OPS_PER_LAYER} eager ops per block at one op's dispatch, not measured at this shape"
    return block_rest, floor, block_words, dispatch_words


def _loss_forward(
    workload: Workload, layout: Layout, calibration: Calibration
) -> tuple[float, str, bool] | None:
    """The cross-entropy's forward share (seconds), in words, and whether the calibration timed it
    at (tokens, vocab / tp); else its eager kernels' bytes over the copy bandwidth (None: no copy
    bandwidth)."""
    tp = layout.tp
    tokens = layout.micro_size * rank_seq_len(workload, layout)
    loss = calibration.cross_entropy_s(tokens, workload.model.vocab_size // tp)
    if loss is not None:
        return loss[0] / (1 + BACKWARD_ELEMENTS), f"cross-entropy {loss[1]}", True
    # The loss runs eagerly in a compiled run too (runner/engine/compile_blocks.py compiles blocks).
    loss_bytes, loss_kernels = loss_traffic(
        tokens, workload.model.vocab_size // tp, workload.precision.torch_dtype_name
    )
    head_rate = calibration.copy_rate(loss_bytes)
    if head_rate is None:
        return None
    loss_words = (
        f"cross-entropy: eager, {loss_kernels} kernels' bytes, counted, over copy bandwidth, "
        "not timed at this shape"
    )
    return loss_bytes / head_rate / (1 + BACKWARD_ELEMENTS), loss_words, False


__all__ = ["BACKWARD_ELEMENTS", "MicroCompute", "gemm_caveats", "micro_compute", "rank_seq_len"]
