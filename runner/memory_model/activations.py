"""Activation bytes per device: Korthikanti et al. 2022 as published, and this project's block.

Activations after Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4.1), kept in the
paper's form (:func:`korthikanti_activations_per_layer`) and adapted tensor by tensor to
this project's block in ``runner/model/transformer.py`` (:func:`activations_per_layer`). The adapted
list was checked against what autograd actually saves for that block on CPU
(``tests/unit/runner/memory_model/test_memory.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from runner.config import ModelConfig, Recompute, ZeroStage
from runner.memory_model.units import BOOL_BYTES, FP32_BYTES, HALF_BYTES, INT64_BYTES, _choice
from runner.model.activation_offload import KEEP_LAST, MIN_OFFLOAD_BYTES
from runner.rules import (
    head_problems,
    loss_tile_count,
    mlp_tile_compile_problem,
    mlp_tile_count,
    selective_compile_problem,
    tp_split_problems,
)

# Precision, optimizer, offload placement, recompute mode and ZeRO stage are runner.config's
# enums; every function here takes the member or its plain value ("bf16", 3), as notebooks pass.
BlockGraph = Literal["eager", "whole", "split"]
_GRAPHS = ("eager", "whole", "split")

# --------------------------------------------------------------------------------------
# Activations: Korthikanti et al. 2022, as published
# --------------------------------------------------------------------------------------


def _check_recompute(recompute: Any) -> Recompute:
    return _choice(recompute, Recompute, "recompute")


def korthikanti_activation_items(
    *,
    seq_len: int,
    micro_size: int,
    d_model: int,
    n_heads: int,
    tp: int = 1,
    recompute: Recompute | str = Recompute.none,
    flash: bool = False,
) -> dict[str, float]:
    """The paper's per-layer activation bytes of a GPT block, tensor by tensor (16-bit, with dropout).

    Korthikanti et al. 2022 (arXiv 2205.05198), Sec. 4.1, s = seq_len, b = micro_size,
    h = d_model, a = n_heads, t = tp (activations 2 bytes, dropout masks 1 byte):

    - attention: QKV input 2sbh; Q, K for QK^T 4sbh; softmax output 2as^2b; its dropout
      mask as^2b; dropout output (attention-over-values input) 2as^2b; V 2sbh; projection
      input 2sbh; residual dropout mask sbh: total 11sbh + 5as^2b.
    - MLP (4h wide, GeLU): input 2sbh; GeLU input 8sbh; second linear input 8sbh; dropout
      mask sbh: total 19sbh.
    - two LayerNorms' inputs: 4sbh.

    Sum (eq. 1): sbh(34 + 5as/h). With tensor parallel t (eq. 2) the LayerNorm inputs, the
    QKV and MLP inputs and the two residual dropout masks (10sbh) are replicated, the rest is
    split: sbh(10 + 24/t + 5as/(ht)). Selective recompute drops the 5as^2b/t score terms;
    full recompute keeps only the block input, 2sbh (Sec. 5). ``flash=True`` (memory-efficient
    attention) also drops the score terms but keeps a logsumexp of a*s*b/t fp32 values.
    """
    mode = _check_recompute(recompute)
    s, b, h, a, t = seq_len, micro_size, d_model, n_heads, tp
    sbh = s * b * h
    if mode == Recompute.full:
        return {"block.input": 2 * sbh}
    items: dict[str, float] = {
        "layernorm1.input": 2 * sbh,
        "qkv.input": 2 * sbh,
        "attention.qk": 4 * sbh / t,
        "attention.v": 2 * sbh / t,
        "attention.proj_input": 2 * sbh / t,
        "attention.dropout_mask": 1 * sbh,
        "layernorm2.input": 2 * sbh,
        "mlp.input": 2 * sbh,
        "mlp.gelu_input": 8 * sbh / t,
        "mlp.fc2_input": 8 * sbh / t,
        "mlp.dropout_mask": 1 * sbh,
    }
    if mode == Recompute.none and not flash:
        scores = a * s * s * b / t
        items["attention.softmax_output"] = 2 * scores
        items["attention.softmax_dropout_mask"] = 1 * scores
        items["attention.softmax_dropout_output"] = 2 * scores
    elif mode == Recompute.none:
        items["attention.logsumexp_fp32"] = FP32_BYTES * a * s * b / t
    return items


def korthikanti_activations_per_layer(
    *,
    seq_len: int,
    micro_size: int,
    d_model: int,
    n_heads: int,
    tp: int = 1,
    recompute: Recompute | str = Recompute.none,
    flash: bool = False,
) -> float:
    """Korthikanti et al. 2022 eq. 1-2 per-layer activation bytes (16-bit GPT block); see the items."""
    return sum(
        korthikanti_activation_items(
            seq_len=seq_len,
            micro_size=micro_size,
            d_model=d_model,
            n_heads=n_heads,
            tp=tp,
            recompute=recompute,
            flash=flash,
        ).values()
    )


# --------------------------------------------------------------------------------------
# Activations: this project's block (runner/model/transformer.py), tensor by tensor
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockShape:
    """What the activations of one block of runner/model/transformer.py depend on, for one micro-batch.

    s = ``seq_len``, b = ``micro_size``, h = ``d_model``, a = ``n_heads``, kv = ``n_kv_heads``
    (default a), f = ``ffn_hidden`` (default 4h), t = ``tp``, p = ``bytes_per_elem`` (the
    compute dtype: 2 for bf16/fp16, 4 for fp32). ``flash``: SDPA takes a fused kernel.
    ``attn_out_aliased`` and ``graph`` (eager, one compiled graph, or compiled graphs split
    at collectives): see :func:`activation_items_per_layer`.
    """

    seq_len: int
    micro_size: int
    d_model: int
    n_heads: int
    n_kv_heads: int | None = None
    ffn_hidden: int | None = None
    tp: int = 1
    flash: bool = False
    bytes_per_elem: int = 2
    attn_out_aliased: bool = False
    graph: BlockGraph = "eager"
    loss_tiles: int = 1  # the pieces the head and loss run in (runner.rules.loss_tile_count)
    mlp_tiles: int = 1  # the pieces each block's MLP runs in (runner.rules.mlp_tile_count)

    def __post_init__(self) -> None:
        n_kv, ffn = self.kv_heads, self.ffn
        sizes = (self.seq_len, self.micro_size, self.d_model, self.n_heads, n_kv, ffn, self.tp)
        if min(*sizes, self.loss_tiles, self.mlp_tiles) < 1:
            raise ValueError(
                "seq_len, micro_size, d_model, n_heads, n_kv_heads, ffn_hidden, tp, loss_tiles and "
                "mlp_tiles must be >= 1"
            )
        if self.graph not in _GRAPHS:
            raise ValueError(f"graph={self.graph!r} is not one of {', '.join(_GRAPHS)}")
        if self.bytes_per_elem not in (HALF_BYTES, FP32_BYTES):
            raise ValueError(f"bytes_per_elem={self.bytes_per_elem} must be 2 (bf16/fp16) or 4 (fp32)")
        # The shapes a run is refused (runner/rules/): whole heads of an even size, and under
        # Megatron-style tensor parallelism whole heads and MLP features on every rank.
        problems = head_problems(d_model=self.d_model, n_head=self.n_heads, n_kv_head=self.n_kv_heads)
        problems += tp_split_problems(self.tp, n_head=self.n_heads, n_kv_head=self.n_kv_heads, ffn_hidden=ffn)
        if self.mlp_tiles > 1 and self.graph != "eager":
            problems.append(mlp_tile_compile_problem(self.mlp_tiles))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn(self) -> int:
        return 4 * self.d_model if self.ffn_hidden is None else self.ffn_hidden

    @property
    def sb(self) -> int:
        """Tokens per micro-batch: s * b."""
        return self.seq_len * self.micro_size

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def local_heads(self) -> int:
        """Query heads on one tensor-parallel rank: a' = a/t."""
        return self.n_heads // self.tp

    @property
    def q_width(self) -> int:
        """Query width on one rank: h' = a' * hs."""
        return self.local_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Key (or value) width on one rank: kv' = kv/t * hs."""
        return self.kv_heads // self.tp * self.head_dim

    @property
    def local_ffn(self) -> int:
        """MLP hidden width on one rank: f' = f/t."""
        return self.ffn // self.tp

    @property
    def mlp_piece(self) -> int:
        """Tokens in the MLP's largest piece: c = ceil(s b / n), n = ``mlp_tiles``. DeepSpeed's
        TiledMLP cuts the flattened tokens so in backward, where a piece's tensors are made
        (deepspeed/runtime/sequence_parallel/ulysses_sp.py ``TiledMLP.backward``)."""
        return -(-self.sb // self.mlp_tiles)


def model_block_shape(
    model: ModelConfig,
    *,
    seq_len: int,
    micro_size: int,
    tp: int,
    bytes_per_elem: int,
    graph: BlockGraph = "eager",
    pp: int = 1,
) -> BlockShape:
    """The BlockShape of a ``ModelConfig`` (runner/config.py) at this micro-batch, tp and pp
    (the pieces the loss runs in depend on them: runner.rules.loss_tile_count; the MLP's on the
    micro-batch's tokens: runner.rules.mlp_tile_count).

    flash=True: runner/model/transformer.py calls scaled_dot_product_attention(is_causal=True), which
    takes a fused kernel on CUDA and on CPU (tests/unit/runner/memory_model/test_memory.py checks the
    CPU one).
    """
    return BlockShape(
        seq_len=seq_len,
        micro_size=micro_size,
        d_model=model.d_model,
        n_heads=model.n_head,
        n_kv_heads=model.n_kv_head,
        ffn_hidden=model.ffn_hidden,
        tp=tp,
        flash=True,
        bytes_per_elem=bytes_per_elem,
        graph=graph,
        loss_tiles=loss_tile_count(model, micro_size=micro_size, seq_len=seq_len, tp=tp, pp=pp),
        mlp_tiles=mlp_tile_count(model, tokens=micro_size * seq_len),
    )


def block_graph(compile_blocks: bool, *, tp: int, zero_stage: ZeroStage | int) -> BlockGraph:
    """How a block runs for BlockShape.graph: eager, or with ``train.compile=true`` one graph or several.

    Measured (runner/engine/compile_blocks.py's summary, tiny model, torch 2.13): ddp, ZeRO 1-2 and
    the pipeline compile each block without a graph break ("whole"). Tensor parallel breaks
    it at its all-reduces and ZeRO-3 at every parameter gather ("split").
    """
    if not compile_blocks:
        return "eager"
    return "whole" if tp == 1 and not ZeroStage(zero_stage).shards_parameters else "split"


def _rmsnorm_items(prefix: str, x: BlockShape) -> dict[str, int]:
    """What runner/model/transformer.py's RMSNorm saves: x.float(), rsqrt, and the normed value before the
    gain.

    ``x32 = x.float(); normed = x32 * rsqrt(mean(x32^2) + eps); normed.type_as(x) * weight``:
    the product x32 * rstd saves both factors (the fp32 input, 4 B/elem: a copy for 16-bit
    x, x itself in fp32; and rstd, 4 B per token); the gain multiply saves the normed value
    in the compute dtype. The output is counted as the next linear's input.

    Compiled (x.graph "whole" or "split"): the graph saves the input in its own dtype and
    rstd, and recomputes the upcast and the normed value in backward.
    """
    if x.graph != "eager":
        return {
            f"{prefix}.input": x.bytes_per_elem * x.sb * x.d_model,
            f"{prefix}.rstd_fp32": FP32_BYTES * x.sb,
        }
    return {
        f"{prefix}.input_fp32": FP32_BYTES * x.sb * x.d_model,
        f"{prefix}.rstd_fp32": FP32_BYTES * x.sb,
        f"{prefix}.normed": x.bytes_per_elem * x.sb * x.d_model,
    }


def _attention_core_items(x: BlockShape) -> dict[str, int]:
    """What RoPE + SDPA (``Attention._core``) save; the part that selective recompute redoes."""
    p = x.bytes_per_elem
    items: dict[str, int] = {}
    # RoPE's multiplies save only cos/sin (x * cos needs cos, not x): views of the fp32
    # buffers, which DeepSpeed 0.19.8 keeps in fp32 under bf16/fp16 (engine.py
    # _configure_distributed_model: "Cast params only; preserve fp32 buffers"). A model cast
    # wholesale (module.to(torch.bfloat16)) would make apply_rope's cos.float()/sin.float()
    # save 4 fp32 copies of (s, hs/2) per layer, 8*s*hs bytes, not counted here.
    # So the rotated q, k are saved once, by SDPA. runner/model/transformer.py repeats k, v to n_head
    # with repeat_interleave before SDPA, so SDPA saves them at full width even with GQA.
    if x.flash:
        # Flash / memory-efficient kernels (CPU: _scaled_dot_product_flash_attention_for_cpu,
        # measured for fp32 and bf16): save q, k, v, out and an fp32 logsumexp (b, a, s).
        items["sdpa.q"] = p * x.sb * x.q_width
        items["sdpa.k"] = p * x.sb * x.q_width
        items["sdpa.v"] = p * x.sb * x.q_width
        items["sdpa.out"] = p * x.sb * x.q_width
        items["sdpa.logsumexp_fp32"] = FP32_BYTES * x.local_heads * x.sb
    else:
        # torch's math path (measured on CPU, torch 2.13): saves scaled copies of q and k, v,
        # and the softmax probabilities (b, a, s, s): all in fp32, as it upcasts 16-bit
        # inputs. Its output is not saved. Korthikanti's 5as/h term is the 16-bit version of
        # the probabilities plus dropout (absent here).
        items["sdpa_math.q_scaled_fp32"] = FP32_BYTES * x.sb * x.q_width
        items["sdpa_math.k_scaled_fp32"] = FP32_BYTES * x.sb * x.q_width
        items["sdpa_math.v_fp32"] = FP32_BYTES * x.sb * x.q_width
        items["sdpa_math.probs_fp32"] = FP32_BYTES * x.local_heads * x.seq_len**2 * x.micro_size
    return items


def activation_items_per_layer(
    block: BlockShape, recompute: Recompute | str = Recompute.none
) -> dict[str, int]:
    """Bytes autograd keeps per block of runner/model/transformer.py for backward, tensor by tensor.

    Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4.1) adapted to this block: no dropout
    (its masks, as^2b + 2sbh, are gone), RMSNorm computed in fp32, RoPE, SwiGLU of width
    f, GQA with k, v repeated to n_head. Sizes as in :class:`BlockShape`; a' = a/t,
    h' = h/t, f' = f/t.

    recompute="none" (every tensor saved by each op, in forward order):

    ==========================  ==================  ======================================
    attention_norm.input_fp32   4 sbh               x.float() (x itself in fp32)
    attention_norm.rstd_fp32    4 sb                rsqrt(mean(x^2) + eps)
    attention_norm.normed       p sbh               normed.type_as(x), saved by `* weight`
    attention.input             p sbh               input of wq, wk, wv (norm output)
    sdpa.q / .k / .v            3 p sbh'            rotated q, k; v; k, v repeated to a'
    sdpa.out                    p sbh'              SDPA output
    sdpa.logsumexp_fp32         4 a'sb              flash kernels only
    wo.input                    p sbh'              y.transpose(1, 2).reshape copy of out
    ffn_norm.*                  4sbh + 4sb + p sbh  as attention_norm
    feed_forward.input          p sbh               input of w1, w3
    w1.output                   p sbf'              silu's input
    silu.output                 p sbf'              saved by the product (w3 x needs grad)
    w3.output                   p sbf'              the product's other factor
    w2.input                    p sbf'              silu(w1 x) * w3 x
    ==========================  ==================  ======================================

    RoPE itself keeps nothing new (its tables are fp32 buffers, kept fp32 by DeepSpeed).

    In bf16 with flash: sbh(26 + 8f/h) + sb(8 + 4a), vs the paper's sbh * 34 (its
    LayerNorm keeps 2 B/elem where this RMSNorm keeps 4 + 2, and SwiGLU keeps four f-wide
    tensors where GeLU keeps two 4h-wide ones). ``flash=False`` replaces the sdpa.* items by
    torch's math path (q, k scaled, v, probabilities: 4(3 sbh' + a's^2b)).

    recompute="attention" (``Attention._core`` = RoPE + SDPA under torch.utils.checkpoint,
    Korthikanti's selective): the core's items go; its inputs are kept instead: q (p sbh'), k and
    v before the GQA repeat (2 p sb kv', kv' = n_kv_heads*hs/t). recompute="full" (each block under
    torch.utils.checkpoint): only the block input, p sbh (Korthikanti Sec. 5's 2sbh in 16-bit).
    recompute="selective" (each block under torch.utils.checkpoint with runner/model/op_recompute.py's
    policy): the block input (p sbh) and what the policy saves: wq's output (p sbh'), wv's
    (p sb kv'), the attention kernel's output and logsumexp (p sbh' + 4 a'sb, flash kernels), w1's
    (p sbf') and w2's (p sbh); nothing else. In bf16 with flash: sbh(8 + 2f/h) + 2 sb kv' + 4 a'sb,
    against 26 sbh + 8 sbf without recompute.

    The MLP in pieces (``mlp_tiles`` > 1, DeepSpeed's TiledMLP, runner/model/transformer.py
    ``FeedForward``): TiledMLP saves its input alone (``ctx.save_for_backward(x)``, the
    ``feed_forward.input`` above) and runs its pieces without grad, so w1.output, silu.output,
    w3.output and w2.input go (4 p sbf' less); under selective recompute w1's and w2's outputs go
    (the policy keeps nothing run without grad, runner/model/op_recompute.py), and the block's
    recompute rebuilds TiledMLP's input. Full recompute keeps the block input either way. Its
    backward rebuilds one piece's four tensors at a time: :func:`mlp_piece_bytes`.

    Tensor parallel: as Korthikanti eq. 2, norm inputs/outputs and the inputs of the
    column-parallel linears stay replicated; the per-head and f-wide tensors split by t.

    ``attn_out_aliased`` and ``graph``: :func:`_saved_by_each_op`.

    Not counted: parameters and buffers (model states) and tensors freed inside forward.
    """
    mode = _check_recompute(recompute)
    x, p = block, block.bytes_per_elem
    if mode == Recompute.full:
        # torch.utils.checkpoint keeps the block's input (and the cos/sin buffer views).
        return {"block.input": p * x.sb * x.d_model}
    if mode == Recompute.selective:
        return _op_level_items(x)

    return _saved_by_each_op(x, mode)


def _saved_by_each_op(x: BlockShape, mode: Recompute) -> dict[str, int]:
    """Every tensor a block's ops save, the attention core's too (``mode`` none) or its inputs
    alone (``mode`` attention): :func:`activation_items_per_layer`'s table.

    ``attn_out_aliased``: on CPU the SDPA output is laid out (B, nh, T, hs), so the reshape
    feeding wo copies it (measured: two tensors). Kernels that return a (B, T, nh, hs)
    layout, as CUDA flash attention is understood to, make that reshape a view: set True to
    count sdpa.out and wo.input once (not verified on a GPU here).

    ``graph`` (:func:`block_graph`): a compiled block's saved tensors are chosen by
    AOTAutograd's min-cut partitioner, which recomputes cheap pointwise ops in backward
    (torch/_functorch/partitioners.py, ``min_cut_rematerialization_partition``). Measured
    on CPU, torch 2.13, fp32 and bf16, with and without selective recompute: each norm
    keeps its input in the compute dtype and rstd (p sbh + 4 sb in place of 4 sbh + 4 sb +
    p sbh), and, in one graph ("whole"), ``silu.output`` is recomputed (p sbf' less). In
    bf16 that is 8 sbh + 2 sbf less per layer: 28% of the tiny model's block. Split at
    collectives ("split": ZeRO-3's gathers, tensor parallel's all-reduces), silu and the
    product land in different graphs, so silu's output is kept; the norms still save less.
    Measured on 2 ranks, fp32, to the byte: ZeRO-3 and tp 2.
    """
    p = x.bytes_per_elem
    items = _rmsnorm_items("attention_norm", x)
    items["attention.input"] = p * x.sb * x.d_model
    if mode == Recompute.none:
        items.update(_attention_core_items(x))
    else:  # attention: checkpoint(self._core, q, k, v, cos, sin) keeps the core's inputs
        items["attention_core.q"] = p * x.sb * x.q_width
        items["attention_core.k"] = p * x.sb * x.kv_width
        items["attention_core.v"] = p * x.sb * x.kv_width
    if not (mode == Recompute.none and x.flash and x.attn_out_aliased):
        items["wo.input"] = p * x.sb * x.q_width
    items.update(_rmsnorm_items("ffn_norm", x))
    items["feed_forward.input"] = p * x.sb * x.d_model
    swiglu = ("w1.output", "silu.output", "w3.output", "w2.input")
    for name in swiglu if x.mlp_tiles == 1 else ():  # TiledMLP keeps its input alone
        if name == "silu.output" and x.graph == "whole":
            continue  # recomputed from w1.output in backward
        items[name] = p * x.sb * x.local_ffn
    return items


def _op_level_items(x: BlockShape) -> dict[str, int]:
    """What a block keeps under op-level selective recompute (runner/model/op_recompute.py): its
    input, and the outputs of the attention kernel and of wq, wv, w1 and w2 (every odd matmul)."""
    if x.graph != "eager":
        raise ValueError(selective_compile_problem())
    p = x.bytes_per_elem
    items = {
        "block.input": p * x.sb * x.d_model,
        "wq.output": p * x.sb * x.q_width,
        "wv.output": p * x.sb * x.kv_width,
    }
    if x.mlp_tiles == 1:  # TiledMLP's pieces run without grad: the policy keeps none of them
        items["w1.output"] = p * x.sb * x.local_ffn
        items["w2.output"] = p * x.sb * x.d_model  # row-parallel under tp: whole h, summed in place
    if x.flash:  # the kernel's outputs: its result and an fp32 logsumexp (b, a', s)
        items["sdpa.out"] = p * x.sb * x.q_width
        items["sdpa.logsumexp_fp32"] = FP32_BYTES * x.local_heads * x.sb
    return items


def mlp_piece_bytes(block: BlockShape) -> int:
    """What the MLP in pieces rebuilds in backward, one piece at a time: 0 when it runs whole.

    TiledMLP's backward runs each piece's forward again with grad (deepspeed/runtime/
    sequence_parallel/ulysses_sp.py ``TiledMLP.backward``), which saves that piece's w1 output,
    silu output, w3 output and product (4 p c f', c = ``BlockShape.mlp_piece`` tokens), freed once
    the piece's backward has run.
    """
    if block.mlp_tiles == 1:
        return 0
    return 4 * block.bytes_per_elem * block.mlp_piece * block.local_ffn


def activations_per_layer(block: BlockShape, recompute: Recompute | str = Recompute.none) -> int:
    """Activation bytes one block of runner/model/transformer.py keeps for backward (see
    activation_items_per_layer)."""
    return sum(activation_items_per_layer(block, recompute).values())


# Items of activation_items_total that are not kept for backward but are live at a peak.
TRANSIENT_ITEMS = frozenset(
    {
        "transient.logits",
        "transient.logits_fp32",
        "transient.loss_grads_fp32",
        "transient.piece_log_probs_fp32",
        "transient.piece_hidden_grads",
        "transient.final_norm_backward",
        "transient.recompute_layer",
    }
)


def at_the_loss(items: dict[str, int]) -> int:
    """The larger of the loss's transients: the logits as forward ends, its gradients as backward starts.

    In pieces (``loss_tiles`` > 1) these are one piece's, and a piece's log-probabilities are live
    beside them (kept whole without pieces); in backward the pieces' input gradients are too.
    """
    piece = items.get("transient.piece_log_probs_fp32", 0)
    forward = items["transient.logits"] + items["transient.logits_fp32"] + piece
    backward = items["transient.loss_grads_fp32"] + piece + items.get("transient.piece_hidden_grads", 0)
    return max(forward, backward)


def after_the_head(items: dict[str, int]) -> int:
    """What the final norm's backward holds beyond the kept items, less what is freed by then.

    By then the loss's saved tensors, the head's input and the norm's output are freed;
    the norm's fp32 working set is live (``transient.final_norm_backward``). Negative when
    the freed outweigh it, as with any vocabulary over a few times h; the tiny model's
    256 entries make it the activation peak.
    """
    freed = sum(v for k, v in items.items() if k.startswith("loss."))
    freed += items["output.input"] + items["final_norm.normed"]
    return items["transient.final_norm_backward"] - freed


def transient_peak(items: dict[str, int]) -> int:
    """The most the transients add to the kept items at once: the loss's, the final norm's
    backward or a recomputed block's (their moments do not coincide)."""
    return max(at_the_loss(items), after_the_head(items), items["transient.recompute_layer"])


def activation_items_outside_blocks(block: BlockShape, *, vocab_size: int) -> dict[str, int]:
    """Bytes outside the blocks: embedding, final norm, output head and the fp32 loss
    (runner/model/transformer.py).

    Kept for backward (b = micro_size, s = seq_len, h = d_model, V = vocab_size, p as above):

    - ``embedding.token_ids``: the lookup saves its int64 indices (8 sb). Its output is
      block 0's input, already counted by that block (its norm input, or the checkpoint).
    - ``final_norm.*``: RMSNorm as in the blocks (4 sbh + 4 sb + p sbh).
    - ``output.input``: the final norm's output, saved by the output linear (p sbh).
    - ``loss.log_probs_fp32``: lm_loss computes cross_entropy on ``logits.float()``;
      log_softmax saves its fp32 output (4 sbV). ``loss.targets``: int64 (8 sb).

    Live while the loss is formed, then freed (``transient.*``, not saved): the logits in the
    compute dtype (p sbV; nothing saves them) and, in 16-bit, their fp32 copy (4 sbV). Live
    when backward starts, beside the saved log-probabilities: ``nll_loss``'s gradient (a
    dense fp32 (sb, V) tensor) and ``log_softmax``'s, made from it (4 sbV each:
    ``transient.loss_grads_fp32``); the forward's and the backward's transients do not
    coincide, and the backward's are the larger (8 sbV against at most 6). The V-wide terms
    dominate for large vocabularies: Llama-3's V = 128256 at h = 2048 makes 4 sbV alone
    250 sbh.

    Live in the final norm's backward, after the output head's (``transient.final_norm_backward``,
    20 sbh in any dtype: its statistics are fp32): at the square's backward (PowBackward0:
    ``grad * 2 * x``, three fp32 sbh tensors at once) the gradient through the rsqrt's
    product and the mean's expanded gradient are live too. Seen in the allocator's events
    of a bf16 step (tiny, micro 8, seq 128): five 1.05 MB tensors above what the loss and
    the head's input had freed. It outgrows the loss's moment only for small vocabularies
    (:func:`after_the_head`); runner.memory_model.peak adds it to what ZeRO 1-2's bucket and a tied
    head's gradient allocate once the head's backward is done.

    These stay eager under ``train.compile`` (only the blocks are compiled).

    In pieces (``block.loss_tiles`` > 1): :func:`_loss_items_in_pieces`; under tensor parallelism
    (``block.tp`` > 1): :func:`_vocab_parallel_loss_items`.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be >= 1")
    p, sb, h = block.bytes_per_elem, block.sb, block.d_model
    items = {
        "embedding.token_ids": INT64_BYTES * sb,
        "final_norm.input_fp32": FP32_BYTES * sb * h,
        "final_norm.rstd_fp32": FP32_BYTES * sb,
        "final_norm.normed": p * sb * h,
        "output.input": p * sb * h,
        "transient.final_norm_backward": 5 * FP32_BYTES * sb * h,
    }
    if block.tp > 1:
        return {**items, **_vocab_parallel_loss_items(block, vocab_size)}
    if block.loss_tiles > 1:
        return {**items, **_loss_items_in_pieces(block, vocab_size)}
    return {
        **items,
        "loss.log_probs_fp32": FP32_BYTES * sb * vocab_size,
        "loss.targets": INT64_BYTES * sb,
        "transient.logits": p * sb * vocab_size,
        # .float() of fp32 logits returns the same tensor: no copy.
        "transient.logits_fp32": FP32_BYTES * sb * vocab_size if p < FP32_BYTES else 0,
        "transient.loss_grads_fp32": 2 * FP32_BYTES * sb * vocab_size,
    }


def _loss_items_in_pieces(block: BlockShape, vocab_size: int) -> dict[str, int]:
    """The loss's bytes when it runs in pieces of the sequence, on one tensor-parallel rank.

    In pieces (``block.loss_tiles`` = n > 1, runner/model/transformer.py ``tiled_lm_loss``):
    each piece of c = b x ceil(s / n) tokens runs under a checkpoint, which keeps its inputs, the
    head's input (``output.input``) and the targets (``loss.targets``), and nothing V-wide. A
    piece's logits (p cV), fp32 copy (4 cV) and log-probabilities (4 cV,
    ``transient.piece_log_probs_fp32``) are live while it is formed, in forward and again in
    backward, beside its two fp32 gradients (8 cV); in backward the pieces' gradients of the
    head's input are gathered before they are joined (p sbh, ``transient.piece_hidden_grads``).
    """
    p, sb, h = block.bytes_per_elem, block.sb, block.d_model
    # One piece's tokens: runner/model/transformer.py tiled_lm_loss splits the sequence in
    # pieces of ceil(s / tiles) tokens; the first is the longest.
    piece = block.micro_size * -(-block.seq_len // block.loss_tiles)
    return {
        "loss.targets": INT64_BYTES * sb,
        "transient.logits": p * piece * vocab_size,
        "transient.logits_fp32": FP32_BYTES * piece * vocab_size if p < FP32_BYTES else 0,
        "transient.loss_grads_fp32": 2 * FP32_BYTES * piece * vocab_size,
        "transient.piece_log_probs_fp32": FP32_BYTES * piece * vocab_size,
        "transient.piece_hidden_grads": p * sb * h,
    }


def _vocab_parallel_loss_items(block: BlockShape, vocab_size: int) -> dict[str, int]:
    """The loss's and the split embedding's bytes under tensor parallelism.

    Under tensor parallelism (``block.tp`` = t > 1) the output head is split by vocabulary
    (runner/parallel/tensor.py): the fullest rank holds v = ceil(V / t) columns of the
    logits, and DeepSpeed's vocabulary-parallel cross-entropy (deepspeed/sequence/
    cross_entropy.py ``_VocabParallelCrossEntropy``) saves its fp32 exponentials (4 sbv),
    each token's sum of them (4 sb), the local targets (8 sb) and two boolean masks (2 sb).
    While it forms them the logits (p sbv), their fp32 copy in 16-bit (4 sbv) and the
    max-shifted logits (4 sbv) are live. Its backward makes the gradient from the saved
    exponentials (4 sbv) and, in 16-bit, casts it to the logits' dtype (p sbv). The
    embedding, split by vocabulary too, saves the mask of the tokens outside its slice
    (1 sb) beside their indices.
    """
    p, sb = block.bytes_per_elem, block.sb
    local = -(-vocab_size // block.tp)  # runner.model.shape.vocab_rows
    copies = 2 if p < FP32_BYTES else 1  # the fp32 copy (16-bit only) and the shifted logits
    return {
        "embedding.vocab_mask": BOOL_BYTES * sb,
        "loss.exp_logits_fp32": FP32_BYTES * sb * local,
        "loss.sum_exp_fp32": FP32_BYTES * sb,
        "loss.targets": INT64_BYTES * sb,
        "loss.target_masks": 2 * BOOL_BYTES * sb,
        "transient.logits": p * sb * local,
        "transient.logits_fp32": copies * FP32_BYTES * sb * local,
        "transient.loss_grads_fp32": FP32_BYTES * sb * local + (p * sb * local if p < FP32_BYTES else 0),
    }


def offloads_block_inputs(model: ModelConfig, *, recompute: Recompute, host_is_device: bool) -> bool:
    """Whether ``model.offload_activations`` moves the checkpointed blocks' inputs off the device:
    under full recompute, on a GPU (DeepSpeed's offload skips a synchronized device's tensors,
    runner/model/activation_offload.py: on CPU ranks the host is the device and nothing moves)."""
    return model.offload_activations and recompute == Recompute.full and not host_is_device


def offloaded_block_inputs(block: BlockShape, *, n_layers: int) -> int:
    """Bytes of block inputs ``model.offload_activations`` keeps in host memory, per micro-batch.

    DeepSpeed 0.19.8's CheckpointHiddenStatesOffload (runner/model/activation_offload.py) moves
    every marked input but the newest ``KEEP_LAST`` (1) and any under ``MIN_OFFLOAD_BYTES``
    (1 KiB): (n_layers - 1) x p sbh, each block's checkpointed input (the ``block.input`` item).
    """
    one = block.bytes_per_elem * block.sb * block.d_model
    return 0 if one < MIN_OFFLOAD_BYTES else max(n_layers - KEEP_LAST, 0) * one


def activation_items_total(
    block: BlockShape,
    *,
    n_layers: int,
    vocab_size: int,
    recompute: Recompute | str = Recompute.none,
    offloaded: bool = False,
) -> dict[str, int]:
    """Activation bytes of the whole model per device, itemised: blocks, outside items, transients.

    ``blocks`` is n_layers x :func:`activations_per_layer`. Outside items as in
    :func:`activation_items_outside_blocks`. ``transient.recompute_layer``: with recompute,
    backward rebuilds one block's (or one attention core's) saved tensors at a time, live
    next to everything still kept; with the MLP in pieces, one piece's (:func:`mlp_piece_bytes`),
    inside the rebuilt block under full recompute, at another moment than the attention core's.

    ``offloaded`` (:func:`offloads_block_inputs`, full recompute only): the inputs
    :func:`offloaded_block_inputs` counts leave ``blocks`` for the host, and the one block rebuilt
    in backward has its input copied back beside its rebuilt tensors (p sbh more).
    """
    mode = _check_recompute(recompute)
    if n_layers < 1:
        raise ValueError(f"n_layers={n_layers} must be >= 1")
    items = {"blocks": n_layers * activations_per_layer(block, mode)}
    items.update(activation_items_outside_blocks(block, vocab_size=vocab_size))
    moved = offloaded_block_inputs(block, n_layers=n_layers) if offloaded and mode == Recompute.full else 0
    items["blocks"] -= moved
    piece = mlp_piece_bytes(block)
    if mode == Recompute.none:
        items["transient.recompute_layer"] = piece
    elif mode == Recompute.full:
        # One block is re-run whole, and its MLP's pieces rebuilt inside it in turn.
        restored = block.bytes_per_elem * block.sb * block.d_model if moved else 0
        items["transient.recompute_layer"] = activations_per_layer(block, Recompute.none) + piece + restored
    else:
        # Selective and attention: what a block keeps less than without recompute (the rerun
        # ops' outputs; attention: one attention core), or one MLP piece, whichever is larger.
        rebuilt = activations_per_layer(block, Recompute.none) - activations_per_layer(block, mode)
        items["transient.recompute_layer"] = max(rebuilt, piece, 0)
    return items


def activations_total(
    block: BlockShape,
    *,
    n_layers: int,
    vocab_size: int,
    recompute: Recompute | str = Recompute.none,
) -> int:
    """Peak activation bytes per device: everything kept for backward plus the larger transient.

    = sum of the kept items of :func:`activation_items_total` + :func:`transient_peak`.
    """
    items = activation_items_total(block, n_layers=n_layers, vocab_size=vocab_size, recompute=recompute)
    kept = sum(v for k, v in items.items() if k not in TRANSIENT_ITEMS)
    return kept + transient_peak(items)


__all__ = [
    "TRANSIENT_ITEMS",
    "BlockGraph",
    "BlockShape",
    "activation_items_outside_blocks",
    "activation_items_per_layer",
    "activation_items_total",
    "activations_per_layer",
    "activations_total",
    "after_the_head",
    "at_the_loss",
    "block_graph",
    "korthikanti_activation_items",
    "korthikanti_activations_per_layer",
    "mlp_piece_bytes",
    "model_block_shape",
    "offloaded_block_inputs",
    "offloads_block_inputs",
    "transient_peak",
]
