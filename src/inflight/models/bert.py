"""bert-tiny and bert-small: BERT encoders with seeded random weights.

bert-tiny (prajjwal1/bert-tiny): 2 layers, hidden 128, 2 attention heads, FFN 512, vocabulary
30522, 512 positions (4.4M parameters). bert-small (google/bert_uncased_L-4_H-512_A-8): 4 layers,
hidden 512, 8 heads, FFN 2048 (29M parameters), the same code at another ``BertShape``. The
model hub is unreachable here and throughput does not depend on weight values, so weights are
drawn from a seeded generator. Output: the CLS token's final hidden state.

The same encoder computes a user's BERT checkpoint (:mod:`inflight.hf_import` loads its weights):
``BertShape.eps`` is its layer-norm epsilon, and ``make_module(pooling="mean", normalize=True)``
the masked mean of the last layer's token states, L2-normalized, as sentence-transformers models
such as all-MiniLM-L6-v2 define their embedding. :class:`inflight.models.architecture.Architecture` is all
of that as data (the registry gives bert-tiny's spec its own).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from inflight.models.pooling import l2_normalize, mean_pool, mean_pool_varlen
from inflight.models.spec import ModelSpec, TensorSpec

if TYPE_CHECKING:
    import torch

VOCAB = 30522
HIDDEN = 128
LAYERS = 2
HEADS = 2
FFN = 512
POSITIONS = 512


@dataclass(frozen=True, kw_only=True)
class BertShape:
    """The sizes of a BERT encoder (the architecture of ``make_module`` is the same for every shape).

    Attributes:
        layers: Encoder layers.
        hidden: Hidden size.
        heads: Attention heads (``hidden`` must divide by it).
        ffn: Feed-forward inner size.
        vocab: Token ids accepted.
        positions: Longest sequence.
        token_types: Rows of the token-type embedding (only row 0, single texts, is ever added).
        eps: Epsilon of every layer norm.
    """

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int = VOCAB
    positions: int = POSITIONS
    token_types: int = 2
    eps: float = 1e-12


#: prajjwal1/bert-tiny's shape.
TINY = BertShape(layers=LAYERS, hidden=HIDDEN, heads=HEADS, ffn=FFN)
#: google/bert_uncased_L-4_H-512_A-8 ("bert-small"): a shape people serve, whose GPU time per batch is
#: comparable to the Python backend's host work per batch.
SMALL = BertShape(layers=4, hidden=512, heads=8, ffn=2048)
#: Score of a masked position in explicit attention: exp() of it is 0 in fp16, bf16 and fp32.
MASKED_SCORE = -30000.0


def make_module(
    seed: int = 0,
    *,
    shape: BertShape = TINY,
    cls_only: bool = True,
    attention: str = "sdpa",
    cls_attention: str | None = None,
    kernels: bool = True,
    pooling: Literal["cls", "mean"] = "cls",
    normalize: bool = False,
    fused_ffn: bool | None = None,
) -> torch.nn.Module:
    """Build bert-tiny (or another ``shape``) in fp32 on the CPU, eval mode, weights from ``seed``.

    Args:
        seed: Weight seed; the same seed gives the same weights for every option below.
        shape: The encoder's sizes (``TINY``: bert-tiny; ``SMALL``: bert-small).
        cls_only: Compute the last layer for the CLS position only (its keys and values still come
            from every position). The output is the CLS state, so this is the same function with
            about half the last layer's work; ``cls_only=False`` is the unmodified encoder.
        attention: ``sdpa`` (``scaled_dot_product_attention`` with a boolean mask) or ``explicit``
            (matmul, additive mask, softmax, matmul: one fusable graph for the compiler).
        cls_attention: The attention of the CLS-only last layer (one query per sequence), ``sdpa``
            or ``explicit``; None: ``attention``.
        kernels: Run the feed-forward block (with its residual and layer norm) and the ``sdpa``
            attention through the fused operators of :mod:`inflight.models.kernels` (Triton kernels
            on a GPU; on the CPU, and for shapes a kernel does not cover, the same PyTorch ops as
            ``kernels=False``). False: plain PyTorch ops only (what ONNX export needs).
        pooling: The output: ``cls``, the first token's final state; ``mean``, the mean of the
            last layer's states over the tokens whose mask bit is 1 (sentence-transformers'
            mean-tokens pooling; every position of the last layer is computed, ``cls_only`` is
            ignored). ``forward_packed`` serves ``cls`` only.
        normalize: L2-normalize the pooled vector (sentence-transformers' ``Normalize``).
        fused_ffn: Run the feed-forward block through ``kernels.ffn_ln``; None: with ``kernels``
            where its kernel takes the layer's sizes (``kernels.ffn_kernel_fits``).

    Raises:
        ValueError: for an unknown ``attention``, ``cls_attention`` or ``pooling``.
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    from inflight.models import kernels as ops

    cls_how: str = cls_attention or attention
    for name, value in (("attention", attention), ("cls_attention", cls_how)):
        if value not in ("sdpa", "explicit"):
            raise ValueError(f"{name}={value!r}: use 'sdpa' or 'explicit'")
    if pooling not in ("cls", "mean"):
        raise ValueError(f"pooling={pooling!r}: use 'cls' or 'mean'")
    last_cls = cls_only and pooling == "cls"
    HIDDEN, HEADS, FFN, LAYERS = shape.hidden, shape.heads, shape.ffn, shape.layers
    VOCAB, POSITIONS, EPS = shape.vocab, shape.positions, shape.eps
    head_dim = HIDDEN // HEADS
    # the fused operator is opaque to the compiler: where its kernel does not take the shape, plain ops fuse better
    fused_ffn = kernels and ops.ffn_kernel_fits(HIDDEN, FFN) if fused_ffn is None else fused_ffn

    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, how: str = attention
    ) -> torch.Tensor:
        if how == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        scores = torch.matmul(q, k.transpose(-2, -1)) * head_dim**-0.5
        # a literal, not finfo(dtype).min: the module is exported in fp32 and served in fp16/bf16
        scores = scores.masked_fill(~keep, MASKED_SCORE)
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def attend_varlen(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: int,
        max_k: int,
    ) -> torch.Tensor:
        """Attention per sequence over unpadded tokens, ``[tq, heads, d]``.

        ``q`` is ``[tq, heads, d]``, ``k`` and ``v`` ``[tk, heads, d]``; sequence i's queries
        ``cu_q[i]:cu_q[i+1]`` see only its keys ``cu_k[i]:cu_k[i+1]``. On a GPU: FlashAttention's
        variable-length kernel (no padding, no mask). Elsewhere: the same function as one masked
        attention over every token (for tests on the CPU).
        """
        if q.is_cuda:
            return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, False, False)[0]
        seq_q = torch.searchsorted(cu_q[1:], torch.arange(q.shape[0]), right=True)
        seq_k = torch.searchsorted(cu_k[1:], torch.arange(k.shape[0]), right=True)
        keep = (seq_q[:, None] == seq_k[None, :])[None]
        a = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=keep)
        return a.transpose(0, 1)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
            self.attn_out = nn.Linear(HIDDEN, HIDDEN)
            self.ln1 = nn.LayerNorm(HIDDEN, eps=EPS)
            self.ffn_in = nn.Linear(HIDDEN, FFN)
            self.ffn_out = nn.Linear(FFN, HIDDEN)
            self.ln2 = nn.LayerNorm(HIDDEN, eps=EPS)

        def ffn(self, x: torch.Tensor) -> torch.Tensor:
            """The feed-forward block, its residual and its layer norm."""
            if fused_ffn:
                f, o, n = self.ffn_in, self.ffn_out, self.ln2
                return ops.ffn_ln(x, f.weight, f.bias, o.weight, o.bias, n.weight, n.bias, n.eps)
            if kernels:
                return self.ln2(x + self.ffn_out(ops.linear_gelu(x, self.ffn_in.weight, self.ffn_in.bias)))
            return self.ln2(x + self.ffn_out(F.gelu(self.ffn_in(x))))

        def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            b, s, h = x.shape
            if kernels and attention == "sdpa" and keep.shape[-2] == 1:  # a key mask (packed rows: per query)
                a = ops.attention(self.qkv(x), keep[:, 0, 0, :], HEADS)
            else:
                q, k, v = self.qkv(x).view(b, s, 3, HEADS, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
                a = attend(q, k, v, keep).transpose(1, 2).reshape(b, s, h)
            x = self.ln1(x + self.attn_out(a))
            return self.ffn(x)

        def forward_cls(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            """The layer's output at position 0 only, ``[b, h]``: queries, FFN and norms for CLS."""
            b, s, h = x.shape
            w, bias = self.qkv.weight, self.qkv.bias
            kv = F.linear(x, w[h:], bias[h:])  # [b, s, 2h]
            x0 = x[:, 0]
            q = F.linear(x0, w[:h], bias[:h])
            if kernels and cls_how == "sdpa":
                a = ops.cls_attention(q, kv, keep[:, 0, 0, :], HEADS)
            else:
                k, v = kv.view(b, s, 2, HEADS, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
                a = attend(q.view(b, HEADS, 1, head_dim), k, v, keep, cls_how)  # [b, heads, 1, d]
            x0 = self.ln1(x0 + self.attn_out(a.reshape(b, h)))
            return self.ffn(x0)

        def forward_queries(self, x: torch.Tensor, keep: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            """The layer's output at ``at`` (``[r, m]`` positions of each row) only, ``[r, m, h]``.

            ``keep`` is ``[r, 1, m, s]``: which keys each of the ``m`` queries of a row may see.
            """
            r, s, h = x.shape
            m = at.shape[1]
            w, bias = self.qkv.weight, self.qkv.bias
            kv = F.linear(x, w[h:], bias[h:]).view(r, s, 2, HEADS, head_dim).permute(2, 0, 3, 1, 4)
            x0 = x.gather(1, at[:, :, None].expand(r, m, h))
            q = F.linear(x0, w[:h], bias[:h]).view(r, m, HEADS, head_dim).transpose(1, 2)
            a = attend(q, kv[0], kv[1], keep, cls_how)  # [r, heads, m, head_dim]
            x0 = self.ln1(x0 + self.attn_out(a.transpose(1, 2).reshape(r, m, h)))
            return self.ffn(x0)

        def forward_varlen(self, x: torch.Tensor, cu: torch.Tensor, max_len: int) -> torch.Tensor:
            """The layer over unpadded sequences: ``x [t, h]``, sequence i is ``x[cu[i]:cu[i+1]]``."""
            t, h = x.shape
            if kernels and attention == "sdpa" and max_len <= ops.MAX_SEQ:
                a = ops.varlen_attention(self.qkv(x), cu, max_len, HEADS)
            else:
                q, k, v = self.qkv(x).view(t, 3, HEADS, head_dim).unbind(1)
                a = attend_varlen(q, k, v, cu, cu, max_len, max_len).reshape(t, h)
            x = self.ln1(x + self.attn_out(a))
            return self.ffn(x)

        def forward_varlen_cls(
            self, x: torch.Tensor, cu: torch.Tensor, cu_one: torch.Tensor, max_len: int
        ) -> torch.Tensor:
            """The layer's output at each sequence's first token only, ``[n, h]`` (``cu_one``: 0..n)."""
            t, h = x.shape
            w, bias = self.qkv.weight, self.qkv.bias
            kv = F.linear(x, w[h:], bias[h:]).view(t, 2, HEADS, head_dim)
            x0 = x[cu[:-1].long()]
            n = x0.shape[0]
            q = F.linear(x0, w[:h], bias[:h]).view(n, HEADS, head_dim)
            a = attend_varlen(q, kv[:, 0], kv[:, 1], cu_one, cu, 1, max_len)
            x0 = self.ln1(x0 + self.attn_out(a.reshape(n, h)))
            return self.ffn(x0)

    class BertTiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(VOCAB, HIDDEN)
            self.position = nn.Embedding(POSITIONS, HIDDEN)
            self.token_type = nn.Embedding(shape.token_types, HIDDEN)
            self.ln = nn.LayerNorm(HIDDEN, eps=EPS)
            self.layers = nn.ModuleList([Layer() for _ in range(LAYERS)])
            # a buffer, not torch.arange(device=...): export would bake the device into the graph
            self.register_buffer("position_ids", torch.arange(POSITIONS), persistent=False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            s = input_ids.shape[1]
            pos = self.get_buffer("position_ids")[:s]
            x = self.word(input_ids) + self.position(pos)[None] + self.token_type.weight[0]
            x = self.ln(x)
            keep = attention_mask[:, None, None, :].bool()
            layers: list[Any] = list(self.layers)
            if last_cls:
                for layer in layers[:-1]:
                    x = layer(x, keep)
                return self.finish(layers[-1].forward_cls(x, keep))
            for layer in layers:
                x = layer(x, keep)
            return self.finish(mean_pool(x, attention_mask) if pooling == "mean" else x[:, 0])

        def finish(self, pooled: torch.Tensor) -> torch.Tensor:
            """The pooled ``[n, h]`` as the output: fp32, L2-normalized with ``normalize``."""
            pooled = pooled.float()
            return l2_normalize(pooled) if normalize else pooled

        def forward_packed(
            self,
            input_ids: torch.Tensor,
            position_ids: torch.Tensor,
            segment: torch.Tensor,
            attention_mask: torch.Tensor,
            cls_pos: torch.Tensor,
        ) -> torch.Tensor:
            """Several sequences per row (:mod:`inflight.models.packing`); the CLS state of each, ``[r, m, h]``.

            Args:
                input_ids: ``[r, s]`` token ids, the row's sequences one after another.
                position_ids: ``[r, s]`` each token's position in its own sequence.
                segment: ``[r, s]`` which sequence of the row a token belongs to (1..m), 0 for the
                    row's padding.
                attention_mask: ``[r, s]`` each token's own mask bit (0 for the row's padding).
                cls_pos: ``[r, m]`` where sequence k of the row starts (any position where the row
                    has no sequence k: that output is not read).

            A token attends to the unmasked tokens of its own sequence only (and to itself, so that a
            row's padding attends to something: those states never reach an output), so each
            sequence's CLS state is the one the unpacked model computes for it alone.

            Raises:
                ValueError: for a module built with ``pooling="mean"`` (use ``forward`` or
                    ``forward_unpadded``).
            """
            if pooling != "cls":
                raise ValueError(
                    f"forward_packed computes CLS states only, and this module pools with {pooling!r}; "
                    "serve it through forward or forward_unpadded (build it with pooling='cls' to pack rows)"
                )
            x = self.word(input_ids) + self.position(position_ids) + self.token_type.weight[0]
            x = self.ln(x)
            s = segment.shape[1]
            m = cls_pos.shape[1]
            key_on = attention_mask[:, None, :] > 0
            same = segment[:, :, None] == segment[:, None, :]
            diag = self.get_buffer("position_ids")[:s]
            keep = same & (key_on | (diag[:, None] == diag[None, :])[None])
            layers: list[Any] = list(self.layers)
            for layer in layers[:-1]:
                x = layer(x, keep[:, None])
            which = self.get_buffer("position_ids")[1 : m + 1]  # sequence numbers 1..m
            keep_q = (segment[:, None, :] == which[None, :, None]) & key_on
            # a query slot with no sequence sees the row's first position (its output is not read)
            keep_q = keep_q | (~keep_q.any(-1, keepdim=True) & (diag == 0)[None, None, :])
            return self.finish(layers[-1].forward_queries(x, keep_q[:, None], cls_pos))

        def forward_unpadded(
            self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int
        ) -> torch.Tensor:
            """Sequences laid end to end without padding (:func:`inflight.models.packing.unpad`); ``[n, h]``.

            Args:
                input_ids: ``[t]`` the kept tokens of every sequence, one sequence after another.
                position_ids: ``[t]`` each token's position in its own sequence.
                cu_seqlens: ``[n + 1]`` int32, where each sequence starts (and ``t`` last).
                max_len: The longest sequence (a bound: FlashAttention's tile count).

            Every token computes only with the tokens of its own sequence, so sequence i's output is
            the one the padded model computes for it with its masked tokens left out (its CLS state,
            or with ``pooling="mean"`` the mean over its tokens; tokens past ``cu_seqlens[-1]`` are
            in no sequence).
            """
            x = self.word(input_ids) + self.position(position_ids) + self.token_type.weight[0]
            x = self.ln(x)
            layers: list[Any] = list(self.layers)
            if pooling == "mean":
                for layer in layers:
                    x = layer.forward_varlen(x, cu_seqlens, max_len)
                return self.finish(mean_pool_varlen(x, cu_seqlens))
            for layer in layers[:-1]:
                x = layer.forward_varlen(x, cu_seqlens, max_len)
            n = cu_seqlens.shape[0] - 1
            cu_one = torch.arange(n + 1, dtype=cu_seqlens.dtype, device=cu_seqlens.device)
            return self.finish(layers[-1].forward_varlen_cls(x, cu_seqlens, cu_one, max_len))

    torch.manual_seed(seed)
    m = BertTiny()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return m.eval()


def make_packed_module(seed: int = 0, **options: Any) -> torch.nn.Module:
    """bert-tiny (the weights of ``make_module(seed)``) taking packed rows: ``forward`` is ``forward_packed``.

    Several sequences share a row (:func:`inflight.models.packing.pack`), each attending only to
    its own tokens, and the CLS state of each comes out at ``[row, k]``: the same function as the
    unpacked model applied to every sequence alone, without padding each to the longest.
    """
    from torch import nn

    class Packed(nn.Module):
        def __init__(self, base: nn.Module) -> None:
            super().__init__()
            self.base = base

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return self.base.forward_packed(*args)  # type: ignore[operator]

    return Packed(make_module(seed, **options)).eval()


def make_unpadded_module(seed: int = 0, max_len: int = 128, **options: Any) -> torch.nn.Module:
    """bert-tiny (the weights of ``make_module(seed)``) over unpadded sequences: ``forward`` is ``forward_unpadded``.

    The sequences of a batch are laid end to end with their masked tokens left out
    (:func:`inflight.models.packing.unpad`), so no token is padding and no attention score is
    masked: each GEMM, norm and GELU runs over real tokens only, and attention is FlashAttention's
    variable-length kernel on a GPU. ``max_len`` bounds every sequence's length. ``options``: further
    :func:`make_module` options (``shape``, ``pooling``, ``normalize``...).
    """
    from torch import nn

    class Unpadded(nn.Module):
        def __init__(self, base: nn.Module) -> None:
            super().__init__()
            self.base = base

        def forward(
            self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
        ) -> torch.Tensor:
            return self.base.forward_unpadded(input_ids, position_ids, cu_seqlens, max_len)  # type: ignore[operator]

    return Unpadded(make_module(seed, **options)).eval()


SPEC = ModelSpec(
    name="bert_tiny",
    description="bert-tiny encoder (2 layers, hidden 128), CLS embedding",
    inputs=(
        TensorSpec(name="input_ids", dtype="int64", dims=(-1,)),
        TensorSpec(name="attention_mask", dtype="int64", dims=(-1,)),
    ),
    outputs=(TensorSpec(name="cls", dtype="float32", dims=(HIDDEN,)),),
    max_batch_size=2048,
    make_module=make_module,
    default_seq_len=64,
    max_seq_len=POSITIONS,
    vocab_size=VOCAB,
    token_input="input_ids",
    seq_input="input_ids",
    mask_input="attention_mask",
    unpadded=True,
    portable_options={"kernels": False},
    reference_options={"cls_only": False, "kernels": False},
)

SMALL_SPEC = ModelSpec(
    name="bert_small",
    description="bert-small encoder (4 layers, hidden 512, 8 heads, FFN 2048), CLS embedding",
    inputs=SPEC.inputs,
    outputs=(TensorSpec(name="cls", dtype="float32", dims=(SMALL.hidden,)),),
    max_batch_size=2048,
    make_module=functools.partial(make_module, shape=SMALL),
    default_seq_len=64,
    max_seq_len=SMALL.positions,
    vocab_size=SMALL.vocab,
    token_input="input_ids",
    seq_input="input_ids",
    mask_input="attention_mask",
    portable_options={"kernels": False},
    reference_options={"cls_only": False, "kernels": False},
)
