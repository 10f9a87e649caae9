"""Fused operators of the served encoder, with Triton kernels for the GPU.

Three custom operators (``torch.library``), each defined by the plain PyTorch code it replaces:

- ``inflight::ffn_ln(x, w1, b1, w2, b2, ln_w, ln_b, eps)``: a transformer layer's feed-forward
  block with its residual and layer norm, ``layer_norm(x + linear(gelu(linear(x, w1, b1)), w2,
  b2))`` (the exact erf GELU). The kernel keeps the ``[tokens, ffn]`` activation on chip: one
  read of ``x`` and one write of the result per token instead of the activation written by the
  first GEMM, read and written by the GELU, read by the second GEMM (in bert_tiny at 2,048 x 64
  tokens, 134 MB each way).
- ``inflight::attention(qkv, keep, heads)``: multi-head attention of short sequences straight from
  the QKV projection ``[b, s, 3 * hidden]`` with a key mask ``[b, s]``, the output ``[b, s,
  hidden]`` the next projection reads: one program per (sequence, head) holds the whole sequence
  (up to ``MAX_SEQ`` tokens), where flash kernels tile for long sequences and leave most of a tile
  empty at 64 tokens.
- ``inflight::cls_attention(q, kv, keep, heads)``: one query per sequence (the CLS-only last
  layer) over the sequence's keys and values ``[b, s, 2 * hidden]``.

On the CPU, for shapes or dtypes a kernel does not cover, and where Triton is missing, each
operator runs its defining PyTorch code; ``covers_*`` say which. The kernels compute in fp32
and round once at their store, so their results differ from the unfused ops' by rounding only
(tests compare both against the fp32 reference). A ``torch.export`` artifact whose module uses
these operators loads only after this module is imported (``inflight.models.artifact.load_module``,
the one loader, imports it).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.nn import functional as F

from inflight.models.triton_kernels import (
    FFN_BLOCK,
    cublaslt_linear_gelu,
    triton_attention,
    triton_cls_attention,
    triton_ffn_ln,
    triton_varlen_attention,
)

LOGGER = logging.getLogger(__name__)


#: Longest sequence the attention kernels hold in one program (beyond it: the PyTorch attention).
MAX_SEQ = 128
#: Widest hidden size the feed-forward kernel takes whole (a power of two from 16).
MAX_HIDDEN = 256
_warned: set[str] = set()


def _low_precision(*ts: torch.Tensor) -> bool:
    return ts[0].dtype in (torch.float16, torch.bfloat16) and all(t.dtype == ts[0].dtype for t in ts)


def triton_available() -> bool:
    """True when Triton imports (it ships with PyTorch's CUDA wheels)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _on_gpu(*ts: torch.Tensor) -> bool:
    if not all(t.is_cuda for t in ts) or len({t.device for t in ts}) != 1:
        return False
    if not triton_available():
        if "triton" not in _warned:
            _warned.add("triton")
            LOGGER.warning("Triton is not importable: the fused kernels fall back to the unfused PyTorch ops")
        return False
    return True


# -- the operators' definitions (the reference each kernel must match) --------------------------


def ffn_ln_reference(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """``layer_norm(x + linear(gelu(linear(x, w1, b1)), w2, b2))``, the unfused ops."""
    return F.layer_norm(x + F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2), (x.shape[-1],), ln_w, ln_b, eps)


def attention_reference(qkv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    """``scaled_dot_product_attention`` of the heads in ``qkv [b, s, 3h]``, key mask ``keep [b, s]``: ``[b, s, h]``."""
    b, s, three_h = qkv.shape
    h = three_h // 3
    q, k, v = qkv.view(b, s, 3, heads, h // heads).permute(2, 0, 3, 1, 4).unbind(0)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.bool()[:, None, None, :])
    return a.transpose(1, 2).reshape(b, s, h)


def varlen_attention_reference(qkv: torch.Tensor, cu_seqlens: torch.Tensor, heads: int) -> torch.Tensor:
    """Attention of sequences laid end to end: ``qkv [t, 3h]``, sequence i is rows ``cu_seqlens[i]:cu_seqlens[i+1]``.

    Each token attends to the tokens of its own sequence; ``[t, h]`` (rows past ``cu_seqlens[-1]``
    belong to no sequence and attend to each other: their values are not read).
    """
    t, three_h = qkv.shape
    h = three_h // 3
    tokens = torch.arange(t, device=qkv.device)
    seq = torch.searchsorted(cu_seqlens[1:].to(tokens.dtype).contiguous(), tokens, right=True)
    keep = (seq[:, None] == seq[None, :])[None]
    q, k, v = qkv.view(t, 3, heads, h // heads).permute(1, 2, 0, 3).unbind(0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(0, 1).reshape(t, h)


def linear_gelu_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu(linear(x, w, b))`` with the exact (erf) GELU."""
    return F.gelu(F.linear(x, w, b))


def cls_attention_reference(q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    """One query per sequence ``q [b, h]`` over ``kv [b, s, 2h]``, key mask ``keep [b, s]``: ``[b, h]``."""
    b, s, two_h = kv.shape
    h = two_h // 2
    d = h // heads
    k, v = kv.view(b, s, 2, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    a = F.scaled_dot_product_attention(q.view(b, heads, 1, d), k, v, attn_mask=keep.bool()[:, None, None, :])
    return a.reshape(b, h)


# -- coverage -----------------------------------------------------------------------------------


def ffn_kernel_fits(hidden: int, ffn: int) -> bool:
    """Whether the feed-forward kernel takes a layer of these sizes.

    It does for a hidden size a power of two from 16 to ``MAX_HIDDEN`` and ``ffn`` a multiple of
    ``FFN_BLOCK``; other layers run as plain ops, which the compiler fuses (bias and GELU in one
    pass, the residual with the layer norm).
    """
    return 16 <= hidden <= MAX_HIDDEN and hidden & (hidden - 1) == 0 and ffn % FFN_BLOCK == 0


def covers_ffn_ln(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether the feed-forward kernel computes this call (shapes and dtypes; the device is checked apart).

    fp16 or bf16 throughout, hidden a power of two from 16 to ``MAX_HIDDEN``, the ffn width a
    multiple of ``FFN_BLOCK``, rows of ``x`` contiguous along the hidden axis, contiguous weights.
    """
    h = x.shape[-1]
    return (
        _low_precision(x, w1, w2)
        and ffn_kernel_fits(h, w1.shape[0])
        and w1.shape[1] == h
        and tuple(w2.shape) == (h, w1.shape[0])
        and x.stride(-1) == 1
        and w1.is_contiguous()
        and w2.is_contiguous()
    )


def covers_attention(t: torch.Tensor, head_dim: int, seq: int) -> bool:
    """Whether the attention kernels compute this call on ``t`` (the projection they read).

    fp16 or bf16, the head size a power of two from 16, ``seq`` at most ``MAX_SEQ``, unit stride
    along the hidden axis.
    """
    return (
        t.dtype in (torch.float16, torch.bfloat16)
        and 1 <= seq <= MAX_SEQ
        and head_dim >= 16
        and head_dim & (head_dim - 1) == 0
        and t.stride(-1) == 1
    )


# -- the operators -------------------------------------------------------------------------------


@torch.library.custom_op("inflight::ffn_ln", mutates_args=())
def ffn_ln(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """``layer_norm(x + linear(gelu(linear(x, w1, b1)), w2, b2), ln_w, ln_b, eps)`` over ``x [..., h]``.

    Args:
        x: ``[..., h]`` token states.
        w1: ``[ffn, h]``: the first linear layer's weight (``nn.Linear`` layout).
        b1: ``[ffn]``: its bias.
        w2: ``[h, ffn]``: the second linear layer's weight.
        b2: ``[h]``: its bias.
        ln_w: ``[h]``: the layer norm's weight.
        ln_b: ``[h]``: the layer norm's bias.
        eps: The layer norm's epsilon.

    Returns:
        ``[..., h]`` in ``x``'s dtype (contiguous).
    """
    return ffn_ln_reference(x, w1, b1, w2, b2, ln_w, ln_b, eps).contiguous()


@ffn_ln.register_fake
def _(x: torch.Tensor, w1: torch.Tensor, *_: Any) -> torch.Tensor:
    return x.new_empty(x.shape)


@ffn_ln.register_kernel("cuda")
def _(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    if _on_gpu(x, w1, w2) and covers_ffn_ln(x, w1, w2) and _low_precision(x, b1, b2, ln_w, ln_b):
        return triton_ffn_ln(x, w1, b1.contiguous(), w2, b2.contiguous(), ln_w.contiguous(), ln_b.contiguous(), eps)
    return ffn_ln_reference(x, w1, b1, w2, b2, ln_w, ln_b, eps).contiguous()


@torch.library.custom_op("inflight::attention", mutates_args=())
def attention(qkv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    """Multi-head attention from a QKV projection: ``qkv [b, s, 3h]``, key mask ``keep [b, s]`` (nonzero: attend).

    Returns:
        ``[b, s, h]``: each position's heads side by side (what the output projection reads).
    """
    return attention_reference(qkv, keep, heads)


@attention.register_fake
def _(qkv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    b, s, three_h = qkv.shape
    return qkv.new_empty((b, s, three_h // 3))


@attention.register_kernel("cuda")
def _(qkv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    if _on_gpu(qkv, keep) and covers_attention(qkv, qkv.shape[-1] // 3 // heads, qkv.shape[1]):
        return triton_attention(qkv, keep, heads)
    return attention_reference(qkv, keep, heads)


@torch.library.custom_op("inflight::cls_attention", mutates_args=())
def cls_attention(q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    """One query per sequence: ``q [b, h]`` over keys and values ``kv [b, s, 2h]``, key mask ``keep [b, s]``.

    Returns:
        ``[b, h]``.
    """
    return cls_attention_reference(q, kv, keep, heads)


@cls_attention.register_fake
def _(q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    return q.new_empty((q.shape[0], kv.shape[-1] // 2))


@cls_attention.register_kernel("cuda")
def _(q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    if _on_gpu(q, kv, keep) and covers_attention(kv, kv.shape[-1] // 2 // heads, kv.shape[1]) and q.dtype == kv.dtype:
        return triton_cls_attention(q, kv, keep, heads)
    return cls_attention_reference(q, kv, keep, heads)


@torch.library.custom_op("inflight::varlen_attention", mutates_args=())
def varlen_attention(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, heads: int) -> torch.Tensor:
    """Multi-head attention of sequences laid end to end, from their QKV projection.

    Args:
        qkv: ``[t, 3h]`` every token's projection, sequence i's at rows ``cu_seqlens[i]:cu_seqlens[i + 1]``.
        cu_seqlens: ``[n + 1]`` int32 where each sequence starts, then the last one's end.
        max_len: A bound on every sequence's length.
        heads: Attention heads.

    Returns:
        ``[t, h]`` (rows past ``cu_seqlens[-1]``: unspecified).
    """
    return varlen_attention_reference(qkv, cu_seqlens, heads)


@varlen_attention.register_fake
def _(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, heads: int) -> torch.Tensor:
    return qkv.new_empty((qkv.shape[0], qkv.shape[1] // 3))


@varlen_attention.register_kernel("cuda")
def _(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, heads: int) -> torch.Tensor:
    if _on_gpu(qkv, cu_seqlens) and covers_attention(qkv, qkv.shape[-1] // 3 // heads, max_len):
        return triton_varlen_attention(qkv, cu_seqlens, max_len, heads)
    return varlen_attention_reference(qkv, cu_seqlens, heads)


@torch.library.custom_op("inflight::linear_gelu", mutates_args=())
def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu(linear(x, w, b))``: on a GPU in fp16/bf16 one GEMM with the GELU in its epilogue (see above).

    Args:
        x: ``[..., k]``.
        w: ``[n, k]`` (``nn.Linear`` layout).
        b: ``[n]``.

    Returns:
        ``[..., n]`` in ``x``'s dtype.
    """
    return linear_gelu_reference(x, w, b)


@linear_gelu.register_fake
def _(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@linear_gelu.register_kernel("cuda")
def _(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if _low_precision(x, w, b) and x.numel() and x.stride(-1) == 1:
        return cublaslt_linear_gelu(x, w, b)
    return linear_gelu_reference(x, w, b)
