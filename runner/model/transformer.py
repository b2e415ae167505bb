"""A Llama-style decoder-only transformer, readable top to bottom.

Architecture (Touvron et al. 2023, "LLaMA", arXiv 2302.13971, and Llama 2,
arXiv 2307.09288): token embedding, then `n_layer` pre-norm blocks of

    x = x + attention(attention_norm(x))       # causal self-attention with RoPE
    x = x + feed_forward(ffn_norm(x))          # SwiGLU MLP

then a final RMSNorm and a bias-free projection to the vocabulary. No dropout, no
learned positions, and no biases except, with ``qkv_bias`` (Qwen2, arXiv 2407.10671),
on the query, key and value projections. RoPE's frequencies may be rescaled for long
contexts as Llama 3.1 does (``rope_scaling=llama3``).

Module names (`tok_embeddings`, `layers.{i}.attention.wq`, `feed_forward.w2`,
`output`, ...) follow Meta's reference implementation on purpose: tensor-parallel
partitioning and memory accounting match parameters by these names.

Notation (nanoGPT): B batch, T sequence length, C = d_model, nh heads,
nkv key/value heads, hs head size = d_model // n_head.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from runner.config import ModelConfig, Recompute, RopeScaling
from runner.model.activation_offload import mark_block_input
from runner.model.build_method import DRAW_BLOCK
from runner.model.meta import materialize
from runner.model.op_recompute import op_level_contexts, outputs_not_kept
from runner.model.sequence_shard import SequenceShard
from runner.model.shape import check_shape, n_kv_head
from runner.model.shape import num_params as num_params  # re-exported: the count sits beside the model
from runner.rules import loss_tile_count, mlp_tile_count


def param_seed(seed: int, name: str) -> int:
    """The RNG seed of one parameter: a function of the run's seed and the parameter's name only."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


_RESIDUAL_PROJECTIONS = ("attention.wo.weight", "feed_forward.w2.weight")


# Elements per generator: a rank holding a slice of a parameter (a ZeRO-3 partition)
# draws only the chunks its slice overlaps.
INIT_CHUNK = 1 << 20


def initial_values(
    cfg: ModelConfig, name: str, shape: Sequence[int], *, seed: int, start: int = 0, stop: int | None = None
) -> torch.Tensor:
    """Elements [start, stop) of parameter `name`'s flattened initial value, fp32 on the host.

    `name` is as `Transformer.named_parameters` names it. Chunk c of INIT_CHUNK elements
    is drawn from its own generator, seeded by `param_seed(seed, f"{name}[{c}]")`, so a
    layout that builds only some parameters (a pipeline stage) or slices of them (ZeRO-3
    partitions) draws the same values as the whole model on one device, and only those.
    Normal(0, init_std) (GPT-2, Radford et al. 2019); the residual projections wo and w2
    scaled by 1/sqrt(2 n_layer), the number of residual layers (same paper, sec. 2.3), so
    the residual stream's variance does not grow with depth; RMSNorm gains at one; biases
    at zero.
    """
    numel = math.prod(shape)
    stop = numel if stop is None else stop
    if not 0 <= start <= stop <= numel:
        raise ValueError(f"[{start}, {stop}) is not a slice of {name}'s {numel} elements")
    out = torch.empty(stop - start)
    if name.endswith("norm.weight"):
        return out.fill_(1.0)
    if name.endswith(".bias"):  # zero, as nn.Linear's users (Megatron-LM, HF's _init_weights) start them
        return out.zero_()
    std = cfg.init_std
    if name.endswith(_RESIDUAL_PROJECTIONS):
        std /= math.sqrt(2 * cfg.n_layer)

    def draw(chunk: int) -> None:
        lo, hi = chunk * INIT_CHUNK, min((chunk + 1) * INIT_CHUNK, numel)
        generator = torch.Generator().manual_seed(param_seed(seed, f"{name}[{chunk}]"))
        a, b = max(lo, start), min(hi, stop)
        if (a, b) == (lo, hi):
            out[a - start : b - start].normal_(mean=0.0, std=std, generator=generator)
        else:
            drawn = torch.empty(hi - lo).normal_(mean=0.0, std=std, generator=generator)
            out[a - start : b - start] = drawn[a - lo : b - lo]

    chunks = range(start // INIT_CHUNK, -(-stop // INIT_CHUNK))
    if len(chunks) == 1:
        draw(chunks[0])
        return out
    # Chunks are independent (own generator, own slice) and torch releases the GIL while
    # drawing: threads draw them in parallel, with the same values as one by one.
    with concurrent.futures.ThreadPoolExecutor(max_workers=torch.get_num_threads()) as pool:
        list(pool.map(draw, chunks))
    return out


@torch.no_grad()
def write_initial_values(
    out: torch.Tensor, cfg: ModelConfig, name: str, shape: Sequence[int], *, seed: int, start: int = 0
) -> None:
    """Write elements [start, start + out.numel()) of parameter `name`'s initial value into `out`.

    `out` is contiguous, on any device, in any floating dtype. The values are drawn on the
    host (`initial_values`) DRAW_BLOCK elements at a time, in blocks aligned to DRAW_BLOCK
    so that no chunk is drawn twice, and rounded once as each block is written.
    """
    flat = out.view(-1)
    stop = start + flat.numel()
    edges = [start, *range((start // DRAW_BLOCK + 1) * DRAW_BLOCK, stop, DRAW_BLOCK), stop]
    for a, b in itertools.pairwise(edges):
        flat[a - start : b - start].copy_(initial_values(cfg, name, shape, seed=seed, start=a, stop=b))


@torch.no_grad()
def write_initial_shard(
    out: torch.Tensor,
    cfg: ModelConfig,
    name: str,
    shape: Sequence[int],
    *,
    seed: int,
    dim: int,
    start: int,
) -> None:
    """Write a tensor-parallel shard of parameter `name`'s initial value into `out`.

    `out` is the slice [start, start + out.shape[dim]) of the whole `shape` along `dim`: 0
    for rows (contiguous in the whole tensor), 1 for the columns of a matrix, drawn a band
    of whole rows (about DRAW_BLOCK elements) at a time and cut.
    """
    if dim == 0:
        write_initial_values(out, cfg, name, shape, seed=seed, start=start * math.prod(shape[1:]))
        return
    if dim != 1 or len(shape) != 2:
        raise ValueError(
            f"{name}: a shard is cut along rows, or along the columns of a matrix, not dim {dim}"
        )
    rows, cols = shape
    width = out.shape[1]
    band = max(1, DRAW_BLOCK // cols)
    for top in range(0, rows, band):
        bottom = min(rows, top + band)
        values = initial_values(cfg, name, shape, seed=seed, start=top * cols, stop=bottom * cols)
        out[top:bottom].copy_(values.view(bottom - top, cols)[:, start : start + width])


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019, arXiv 1910.07467)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise over the last dim; the statistics are computed in fp32."""
        # In bf16 the mean of squares loses too many bits; do it in fp32 and
        # cast back before the (low-precision) gain, as Meta's reference does.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """RoPE's angular frequency of each channel pair, (head_dim // 2,) in fp32, scaled as cfg says."""
    head_dim = cfg.d_model // cfg.n_head
    # RoFormer (Su et al. 2021, arXiv 2104.09864) eq. 15: channel pair i rotates
    # at frequency theta^(-2i/d); position m rotates it by angle m * freq_i.
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    if cfg.rope_scaling == RopeScaling.llama3:
        inv_freq = llama3_scaled(inv_freq, cfg)
    return inv_freq


def llama3_scaled(inv_freq: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Llama 3.1's RoPE scaling of the frequencies ``inv_freq``.

    As transformers' modeling_rope_utils.py ``_compute_llama3_parameters`` (and Meta's
    llama-models ``apply_scaling``): a wavelength shorter than original / high_freq_factor
    keeps its frequency, one longer than original / low_freq_factor has it divided by
    ``factor``, and the band between blends the two by a ramp linear in original / wavelength.
    """
    factor, low, high = cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    original = cfg.rope_original_max_seq_len
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def rope_cache(cfg: ModelConfig, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for RoPE's first ``seq_len`` positions, each (seq_len, head_dim // 2), in fp32."""
    angles = torch.outer(torch.arange(seq_len).float(), rope_frequencies(cfg))  # (T, hs/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs of x (B, nh, T, hs) by position; cos/sin are (T, hs/2)."""
    # Pairs are (i, i + hs/2) ("rotate half", as in HF/GPT-NeoX) rather than the
    # paper's adjacent (2i, 2i+1): a fixed permutation of wq/wk's output
    # channels, so the model family is the same. Done in fp32 for the angles.
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)  # (B, nh, T, hs/2) each
    cos, sin = cos.float(), sin.float()  # broadcast over (B, nh)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.type_as(x)


class Attention(nn.Module):
    """Causal multi-head self-attention with RoPE and grouped-query key/values."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.d_model // cfg.n_head
        n_kv = n_kv_head(cfg)
        self.wq = nn.Linear(cfg.d_model, cfg.n_head * self.head_dim, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.d_model, n_kv * self.head_dim, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.d_model, n_kv * self.head_dim, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_head * self.head_dim, cfg.d_model, bias=False)
        self.core_recompute = cfg.activation_checkpointing == Recompute.attention
        # Under sequence parallelism, DeepSpeed's DistributedAttention around local_attention
        # (runner/parallel/sequence.py); None: this rank holds whole sequences.
        self.sequence_attention: nn.Module | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); cos/sin are the RoPE tables of x's positions."""
        if self.sequence_attention is not None:
            return self._forward_sequence_piece(x, cos, sin)
        B, T, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        # Head counts come from the projection widths, not the config: under
        # tensor parallelism wq/wk/wv hold only this rank's heads.
        nh = q.shape[-1] // self.head_dim
        nkv = k.shape[-1] // self.head_dim
        q = q.view(B, T, nh, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nkv, self.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, nkv, self.head_dim).transpose(1, 2)  # (B, nkv, T, hs)
        if self.core_recompute and self.training:
            # Selective activation recomputation (Korthikanti et al. 2022,
            # arXiv 2205.05198): keep the projections, which are cheap to store
            # and costly to recompute, and rerun only the attention core, whose
            # intermediates grow with T^2 (without a fused kernel) or hold
            # rotated copies of q and k.
            y = checkpoint(self._core, q, k, v, cos, sin, use_reentrant=False)
        else:
            y = self._core(q, k, v, cos, sin)
        y = y.transpose(1, 2).reshape(B, T, nh * self.head_dim)  # (B, T, nh*hs)
        return self.wo(y)

    def _forward_sequence_piece(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, T/sp, C), this rank's piece of each sample -> (B, T/sp, C): RoPE rotates the
        piece's queries and keys at their positions, then DistributedAttention exchanges heads for
        sequence, attends (``local_attention``) and exchanges back (runner/parallel/sequence.py)."""
        assert self.sequence_attention is not None
        B, T, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        q = q.view(B, T, -1, self.head_dim)  # (B, T/sp, nh, hs)
        k = k.view(B, T, -1, self.head_dim)  # (B, T/sp, nkv, hs)
        v = v.view(B, T, -1, self.head_dim)
        cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over the heads, now dim 2
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.sequence_attention(q, k, v, batch_dim_idx=0)  # (B, T/sp, nh, hs)
        return self.wo(y.reshape(B, T, -1))

    def local_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of whole sequences of some heads, each (B, T, heads, hs), RoPE applied:
        (B, T, nh', hs); under ``attention`` recompute its insides are run again in backward."""
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hs)
        if self.core_recompute and self.training:
            y = checkpoint(self._grouped_attention, q, k, v, use_reentrant=False)
        else:
            y = self._grouped_attention(q, k, v)
        return y.transpose(1, 2)

    @staticmethod
    def _grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Key/value head repeat and causal attention of (B, heads, T, hs) tensors."""
        # GQA (Ainslie et al. 2023, arXiv 2305.13245): each key/value head is
        # shared by nh/nkv consecutive query heads.
        n_rep = q.shape[1] // k.shape[1]
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=1)  # (B, nh, T, hs)
            v = v.repeat_interleave(n_rep, dim=1)  # (B, nh, T, hs)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    @staticmethod
    def _core(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """RoPE, key/value head repeat and causal attention: (B, nh, T, hs)."""
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return Attention._grouped_attention(q, k, v)


class FeedForward(nn.Module):
    """SwiGLU MLP (Shazeer 2020, arXiv 2002.05202): w2(silu(w1 x) * w3 x).

    With ``model.mlp_tiles`` above 1 it runs through DeepSpeed's ``TiledMLP`` (ALST, arXiv
    2506.13996): forward over pieces of the tokens keeping only its input, and in backward
    each piece's forward again, then its backward, so the (B, T, ffn_hidden) tensors exist for
    one piece at a time. The extra forward is priced by the plan (runner/step_time/
    calibrated_terms.py, "mlp pieces"). TiledMLP holds each weight's gradient back from ZeRO's
    reduction until the last piece (``ds_grad_is_ready``), so ZeRO sees one gradient per backward.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)  # gate
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)  # down
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)  # up
        self.cfg = cfg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C)."""
        B, T, _ = x.shape
        tiles = mlp_tile_count(self.cfg, tokens=B * T)
        if tiles == 1:
            return self._swiglu(x)
        # Imported here: DeepSpeed's import is seconds, and the model is built where no rank runs
        # (plan=true, the tests).
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

        weights = [self.w1.weight, self.w2.weight, self.w3.weight]
        with outputs_not_kept():  # the pieces run again in TiledMLP's backward: keep none of them
            return TiledMLP.apply(FeedForward._swiglu, self, x, tiles, weights)

    def _swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP over x (..., T, C) -> (..., T, C), whole or one piece."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """One pre-norm block: attention then feed-forward, each with a residual."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C)."""
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


def checkpointed_block(
    block: nn.Module,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mode: Recompute,
    *,
    training: bool,
) -> torch.Tensor:
    """One block's forward as ``mode`` keeps it for backward: full recompute keeps only the block's
    input and reruns the block; selective keeps the matmuls' and attention's outputs too and reruns
    the rest (runner/model/op_recompute.py); none and attention run it as it is. Under full
    recompute the input is marked for the activation offload, where one is open
    (runner/model/activation_offload.py, ``model.offload_activations``)."""
    if training and mode == Recompute.full:
        mark_block_input(x)
        return checkpoint(block, x, cos, sin, use_reentrant=False)
    if training and mode == Recompute.selective:
        return checkpoint(block, x, cos, sin, use_reentrant=False, context_fn=op_level_contexts)
    return block(x, cos, sin)


class Transformer(nn.Module):
    """The decoder: embeddings, `n_layer` blocks, final norm, vocabulary head."""

    def __init__(self, cfg: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        check_shape(cfg)
        self.cfg = cfg
        # Given an empty weight, nn.Embedding skips its own normal_ init, which init_weights
        # would overwrite anyway; on the meta device that init runs through torch._refs,
        # whose first use imports torch._dynamo: 3 s of every rank's start on 2 CPU cores.
        self.tok_embeddings = nn.Embedding(
            cfg.vocab_size, cfg.d_model, _weight=torch.empty(cfg.vocab_size, cfg.d_model)
        )
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            # Weight tying (Press & Wolf 2017, arXiv 1608.05859): one Parameter.
            self.output.weight = self.tok_embeddings.weight
        # Non-persistent: derived from the config, so not in checkpoints, but
        # registered so that .to(device) moves them with the parameters. A
        # .bfloat16() cast of the model casts them too; apply_rope still does
        # the rotation itself in fp32.
        self.loss_function = CausalLMLoss()
        # Under sequence parallelism, this rank's piece of each sample (runner/parallel/sequence.py).
        self.sequence_shard: SequenceShard | None = None
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        # On the meta device (build_model) or partitioned by a zero.Init context
        # (runner/engine/zero_init.py) there is nothing to write yet: the builder initialises.
        if not any(p.is_meta or hasattr(p, "ds_id") for p in self.parameters()):
            self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """(Re)initialise parameters (`write_initial_values`) and the RoPE tables in place.

        Also the way to materialise a model built on the meta device:
        runner.model.meta.materialize(model, device); model.init_weights(seed). A model partitioned by
        zero.Init is initialised by runner/engine/zero_init.py instead.
        """
        if self.cfg.tie_embeddings:
            # nn.Module.to_empty() replaces Parameters one by one, which unties them.
            self.output.weight = self.tok_embeddings.weight
        for name, param in self.named_parameters():  # a tied weight once, by its first name
            write_initial_values(param, self.cfg, name, param.shape, seed=seed)
        self.init_rope(self.tok_embeddings.weight.device)

    def init_rope(self, device: torch.device) -> None:
        """The RoPE tables for `max_seq_len` positions, on `device`."""
        cos, sin = rope_cache(self.cfg, self.cfg.max_seq_len)
        self.rope_cos = cos.to(device)
        self.rope_sin = sin.to(device)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T) int64 -> logits (B, T, vocab_size); with targets (B, T), their mean loss.

        With targets the head and loss run in ``loss_tile_count`` pieces of the sequence
        (``tiled_lm_loss``), so the whole logits are never held, unless tensor parallelism
        has installed DeepSpeed's vocabulary-parallel loss (runner/parallel/tensor.py). Under
        sequence parallelism the model runs its rank's piece of each sample and returns the
        logits or the mean loss of that piece.
        """
        if self.sequence_shard is not None:
            first = self.sequence_shard.first_position(tokens.shape[1])
            self._check_length(tokens.shape[1])
            tokens = self.sequence_shard.piece(tokens)
            targets = None if targets is None else self.sequence_shard.piece(targets)
        else:
            first = 0
        hidden = self.final_hidden(tokens, first_position=first)
        if targets is None:
            return self.output(hidden)
        B, T = tokens.shape
        if isinstance(self.loss_function, CausalLMLoss):  # not AutoTP's vocabulary-parallel loss
            tiles = loss_tile_count(self.cfg, micro_size=B, seq_len=T)
            if tiles > 1:
                return tiled_lm_loss(self.output, hidden, targets, tiles=tiles)
        return self.loss_function(self.output(hidden), shift_labels=targets)

    def _check_length(self, length: int) -> None:
        """Refuse a sample longer than the RoPE tables, in the key's words."""
        if length > self.rope_cos.shape[0]:
            raise ValueError(
                f"sequence length {length} > model.max_seq_len={self.cfg.max_seq_len}; "
                "raise model.max_seq_len or lower data.seq_len"
            )

    def final_hidden(self, tokens: torch.Tensor, *, first_position: int = 0) -> torch.Tensor:
        """tokens (B, T) int64 at positions ``first_position`` on -> the final norm's output (B, T, C),
        the output head's input."""
        _, T = tokens.shape
        self._check_length(first_position + T)
        positions = slice(first_position, first_position + T)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (T, hs/2)
        x = self.tok_embeddings(tokens)  # (B, T, C)
        for layer in self.layers:
            x = checkpointed_block(
                layer, x, cos, sin, self.cfg.activation_checkpointing, training=self.training
            )
        return self.norm(x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32 whatever the logits' dtype."""
    # A bf16 log-softmax over a large vocabulary loses visible precision.
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


def tiled_lm_loss(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, tiles: int
) -> torch.Tensor:
    """``lm_loss(head(hidden), targets)`` computed over ``tiles`` pieces of the sequence.

    Each piece's logits, their fp32 copy and log-probabilities live only while that piece is
    computed: its summed cross-entropy runs under a non-reentrant checkpoint, which keeps the
    piece's inputs (views of ``hidden`` and ``targets``) and runs the piece again in backward.
    The pieces' sums over all tokens equal the whole mean (measured within 1e-6 relative in
    loss and gradients, tests/unit/runner/model/test_tiled_loss.py). Autograd sums the pieces'
    head-weight gradients before that weight's gradient hook fires, once per backward as
    without pieces, so ZeRO's reduction hooks, a tied embedding, accumulation and fp16's loss
    scale see one gradient. The head's forward runs twice: 2 x tokens x d_model x vocab FLOPs
    more, priced by the plan (runner/step_time/calibrated_terms.py, "loss pieces").
    Arctic Long Sequence Training tiles the same way (ALST, arXiv 2506.13996).
    """
    if tiles < 1:
        raise ValueError(f"tiles={tiles} must be >= 1")
    length = -(-targets.shape[1] // tiles)
    kept = torch.is_grad_enabled()  # evaluation keeps nothing for a backward: no checkpoint
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for piece, piece_targets in zip(hidden.split(length, dim=1), targets.split(length, dim=1), strict=True):
        if kept:
            total = total + checkpoint(_summed_lm_loss, head, piece, piece_targets, use_reentrant=False)
        else:
            total = total + _summed_lm_loss(head, piece, piece_targets)
    return total / targets.numel()


def _summed_lm_loss(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The summed next-token cross-entropy of one piece, in fp32 whatever the logits' dtype."""
    logits = head(hidden)
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), reduction="sum")


class CausalLMLoss:
    """``Transformer.loss_function``: ``lm_loss`` of the logits against the next tokens.

    Called as ``loss_function(logits, shift_labels=targets)``, the hook by which DeepSpeed's
    AutoTP installs its vocabulary-parallel loss when it splits the output head by
    vocabulary (deepspeed/sequence/cross_entropy.py ``configure_vocab_parallel_loss``):
    each rank then holds its vocabulary slice of the logits only.
    """

    def __call__(self, logits: torch.Tensor, *, shift_labels: torch.Tensor, **_: object) -> torch.Tensor:
        return lm_loss(logits, shift_labels)


def build_model(
    cfg: ModelConfig,
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Transformer:
    """Build and initialise a Transformer for `cfg` and `seed` on `device` (default: torch's).

    `dtype` (default fp32) is the parameters' dtype: each initial value is drawn in fp32
    and rounded once as it is written, as DeepSpeed's own cast of an fp32 model would
    (engine.py ``_configure_distributed_model``), so a 16-bit build trains bit for bit as
    one cast by DeepSpeed. The RoPE tables stay fp32, as DeepSpeed keeps them.
    """
    target = torch.device(device) if device is not None else torch.get_default_device()
    # Construct on "meta" (shapes only), then allocate once on the target and
    # initialise: no full CPU copy of a large model, no throwaway default init,
    # and the same weights for a seed whichever device they land on.
    with torch.device("meta"):
        model = Transformer(cfg)
        if dtype is not None:
            model.to(dtype)  # shapes only: nothing is allocated or rounded yet
    if target.type != "meta":
        materialize(model, target)
        model.init_weights(seed)
    return model
