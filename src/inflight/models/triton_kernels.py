"""The Triton kernels of :mod:`inflight.models.kernels`' operators, their launchers and measured configurations.

Kept apart from the operators (which say what each computes and when a kernel takes a call): the
kernels' sources (compiled per shape on first use; ``TRITON_INTERPRET=1`` runs them on the CPU), the
launch configurations measured on the GPU hosts, and the cuBLASLt GEMM with its GELU epilogue. Each
launcher takes only a call its operator's coverage check accepts.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

#: Columns of the feed-forward activation computed per step (the ffn width must be a multiple),
#: and the software pipeline's stages: the fastest of ``scripts/lab/tune_ffn_kernel.py``'s grid on the
#: H200 (``results/engine-profile-20261124/ffn_configs.json``).
FFN_BLOCK = 32
FFN_STAGES = 3

_LOG2E = 1.4426950408889634
_kernels: dict[bool, Any] = {}


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n`` <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


# -- Triton kernels -------------------------------------------------------------------------------


def _build_kernels() -> dict[str, Any]:
    """The three kernels (compiled per shape on first use; ``TRITON_INTERPRET=1`` runs them on the CPU)."""
    import triton
    import triton.language as tl

    @triton.jit
    def ffn_ln_kernel(  # type: ignore[no-untyped-def]
        x_ptr,
        w1_ptr,
        b1_ptr,
        w2_ptr,
        b2_ptr,
        g_ptr,
        beta_ptr,
        y_ptr,
        M,
        stride_x,
        stride_y,
        eps,
        H: tl.constexpr,
        FF: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_F: tl.constexpr,
        ERF_POLY: tl.constexpr,
    ):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rh = tl.arange(0, H)
        rf = tl.arange(0, BLOCK_F)
        rows = rm < M
        x = tl.load(x_ptr + rm[:, None] * stride_x + rh[None, :], mask=rows[:, None], other=0.0)
        acc = tl.zeros((BLOCK_M, H), dtype=tl.float32)
        for f0 in range(0, FF, BLOCK_F):
            w1 = tl.load(w1_ptr + (f0 + rf)[None, :] * H + rh[:, None])  # [H, BLOCK_F] of w1 [FF, H]
            a = tl.dot(x, w1) + tl.load(b1_ptr + f0 + rf).to(tl.float32)[None, :]
            if ERF_POLY:
                # erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, about one fp32 ulp at 1): one exp2
                z = tl.abs(a) * 0.7071067811865476
                t = 1.0 / (1.0 + 0.3275911 * z)
                poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
                e = 1.0 - poly * tl.exp2(-z * z * 1.4426950408889634)
                a = 0.5 * a * (1.0 + tl.where(a < 0, -e, e))
            else:
                a = 0.5 * a * (1.0 + tl.math.erf(a * 0.7071067811865476))
            w2 = tl.load(w2_ptr + rh[None, :] * FF + (f0 + rf)[:, None])  # [BLOCK_F, H] of w2 [H, FF]
            acc = tl.dot(a.to(w2.dtype), w2, acc)
        z = acc + tl.load(b2_ptr + rh).to(tl.float32)[None, :] + x.to(tl.float32)
        mean = tl.sum(z, axis=1) / H
        d = z - mean[:, None]
        var = tl.sum(d * d, axis=1) / H
        y = d / tl.sqrt(var + eps)[:, None]
        y = y * tl.load(g_ptr + rh).to(tl.float32)[None, :] + tl.load(beta_ptr + rh).to(tl.float32)[None, :]
        tl.store(y_ptr + rm[:, None] * stride_y + rh[None, :], y.to(y_ptr.dtype.element_ty), mask=rows[:, None])

    @triton.jit
    def attention_kernel(  # type: ignore[no-untyped-def]
        qkv_ptr,
        keep_ptr,
        o_ptr,
        S,
        stride_qb,
        stride_qs,
        stride_kb,
        stride_ob,
        stride_os,
        scale,
        HEADS: tl.constexpr,
        D: tl.constexpr,
        BLOCK_S: tl.constexpr,
        GROUP: tl.constexpr,
    ):
        b = tl.program_id(0)
        rs = tl.arange(0, BLOCK_S)
        rd = tl.arange(0, D)
        valid = rs < S
        keep = (tl.load(keep_ptr + b * stride_kb + rs, mask=valid, other=0) != 0) & valid
        for g in tl.static_range(GROUP):
            head = tl.program_id(1) * GROUP + g
            at = qkv_ptr + b * stride_qb + rs[:, None] * stride_qs + head * D + rd[None, :]
            q = tl.load(at, mask=valid[:, None], other=0.0)
            k = tl.load(at + HEADS * D, mask=valid[:, None], other=0.0)
            v = tl.load(at + 2 * HEADS * D, mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            # a finite floor: a sequence with every key masked averages its values instead of NaN
            s = tl.where(keep[None, :], s, -1.0e30)
            p = tl.exp2(s - tl.max(s, axis=1)[:, None])
            o = tl.dot(p.to(v.dtype), v) / tl.sum(p, axis=1)[:, None]
            out = o_ptr + b * stride_ob + rs[:, None] * stride_os + head * D + rd[None, :]
            tl.store(out, o.to(o_ptr.dtype.element_ty), mask=valid[:, None])

    @triton.jit
    def varlen_attention_kernel(  # type: ignore[no-untyped-def]
        qkv_ptr,
        cu_ptr,
        o_ptr,
        stride_qs,
        stride_os,
        scale,
        shorter,
        HEADS: tl.constexpr,
        D: tl.constexpr,
        BLOCK_S: tl.constexpr,
        GROUP: tl.constexpr,
    ):
        n = tl.program_id(0)
        start = tl.load(cu_ptr + n).to(tl.int64)
        length = tl.load(cu_ptr + n + 1).to(tl.int64) - start
        rs = tl.arange(0, BLOCK_S)
        rd = tl.arange(0, D)
        valid = rs < length
        # each launch takes the sequences of its tile's lengths (shorter < length <= BLOCK_S); the rest return
        todo = GROUP * ((length > shorter) & (length <= BLOCK_S)).to(tl.int32)
        for g in range(todo):
            head = tl.program_id(1) * GROUP + g
            at = qkv_ptr + (start + rs)[:, None] * stride_qs + head * D + rd[None, :]
            q = tl.load(at, mask=valid[:, None], other=0.0)
            k = tl.load(at + HEADS * D, mask=valid[:, None], other=0.0)
            v = tl.load(at + 2 * HEADS * D, mask=valid[:, None], other=0.0)
            s = tl.where(valid[None, :], tl.dot(q, tl.trans(k)) * scale, -1.0e30)
            p = tl.exp2(s - tl.max(s, axis=1)[:, None])
            o = tl.dot(p.to(v.dtype), v) / tl.sum(p, axis=1)[:, None]
            out = o_ptr + (start + rs)[:, None] * stride_os + head * D + rd[None, :]
            tl.store(out, o.to(o_ptr.dtype.element_ty), mask=valid[:, None])

    @triton.jit
    def cls_attention_kernel(  # type: ignore[no-untyped-def]
        q_ptr,
        kv_ptr,
        keep_ptr,
        o_ptr,
        S,
        stride_qb,
        stride_kvb,
        stride_kvs,
        stride_kb,
        stride_ob,
        scale,
        HEADS: tl.constexpr,
        D: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):
        b = tl.program_id(0)
        rs = tl.arange(0, BLOCK_S)
        rd = tl.arange(0, D)
        valid = rs < S
        keep = (tl.load(keep_ptr + b * stride_kb + rs, mask=valid, other=0) != 0) & valid
        for head in tl.static_range(HEADS):
            q = tl.load(q_ptr + b * stride_qb + head * D + rd).to(tl.float32)
            at = kv_ptr + b * stride_kvb + rs[:, None] * stride_kvs + head * D + rd[None, :]
            k = tl.load(at, mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], axis=1) * scale
            s = tl.where(keep, s, -1.0e30)
            p = tl.exp2(s - tl.max(s, axis=0))
            v = tl.load(at + HEADS * D, mask=valid[:, None], other=0.0).to(tl.float32)
            o = tl.sum(p[:, None] * v, axis=0) / tl.sum(p, axis=0)
            tl.store(o_ptr + b * stride_ob + head * D + rd, o.to(o_ptr.dtype.element_ty))

    return {
        "ffn_ln": ffn_ln_kernel,
        "attention": attention_kernel,
        "varlen_attention": varlen_attention_kernel,
        "cls_attention": cls_attention_kernel,
    }


def _kernel(name: str) -> Any:
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if interpret not in _kernels:
        _kernels[interpret] = _build_kernels()
    return _kernels[interpret][name]


def ffn_block_rows(rows: int) -> tuple[int, int]:
    """(rows per program, warps) of the feed-forward kernel for ``rows`` tokens.

    The tuning grid's fastest on the H200 (``scripts/lab/tune_ffn_kernel.py``): 64 rows at 2,048 x 64
    tokens, 128 at 512 x 64 (fewer programs, one wave), 16 for the CLS-only layer's few rows.
    """
    if rows >= 65536:
        return 64, 4
    if rows >= 8192:
        return 128, 4
    return 16, 4


#: The feed-forward kernel's erf: ``poly`` (Abramowitz & Stegun 7.1.26, one exp2) or ``libdevice``.
FFN_ERF = "poly"


def triton_ffn_ln(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    ln_w: torch.Tensor,
    ln_b: torch.Tensor,
    eps: float,
    config: tuple[int, int, int, int, str] | None = None,
) -> torch.Tensor:
    """The feed-forward kernel on a call ``covers_ffn_ln`` accepts.

    Args:
        x: Token states (see ``ffn_ln``).
        w1: First linear layer's weight.
        b1: Its bias.
        w2: Second linear layer's weight.
        b2: Its bias.
        ln_w: Layer norm weight.
        ln_b: Layer norm bias.
        eps: Layer norm epsilon.
        config: ``(rows per program, ffn columns per step, warps, stages, erf)`` in place of the
            defaults (``ffn_block_rows``, ``FFN_BLOCK``, ``FFN_STAGES``, ``FFN_ERF``): for tuning.
    """
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    m = x2.shape[0]
    y = torch.empty((m, h), dtype=x.dtype, device=x.device)
    if m:
        block_m, warps = ffn_block_rows(m)
        block_f, stages, erf = FFN_BLOCK, FFN_STAGES, FFN_ERF
        if config is not None:
            block_m, block_f, warps, stages, erf = config
        grid = ((m + block_m - 1) // block_m,)
        _kernel("ffn_ln")[grid](
            x2,
            w1,
            b1,
            w2,
            b2,
            ln_w,
            ln_b,
            y,
            m,
            x2.stride(0),
            y.stride(0),
            float(eps),
            H=h,
            FF=w1.shape[0],
            BLOCK_M=block_m,
            BLOCK_F=block_f,
            ERF_POLY=erf == "poly",
            num_warps=warps,
            num_stages=stages,
        )
    return y.view(*x.shape[:-1], h)


def _keep_bytes(keep: torch.Tensor) -> torch.Tensor:
    """The key mask as one byte per key (a bool tensor is viewed, not copied)."""
    return keep.view(torch.uint8) if keep.dtype == torch.bool else keep


def attention_config(heads: int, block_s: int) -> tuple[int, int]:
    """(heads per program, warps) of the attention kernel for ``heads`` heads and a ``block_s`` tile."""
    return ATTENTION_CONFIGS.get((heads, block_s), (1, 4 if block_s <= 64 else 8))


#: (heads per program, warps) of the attention kernel by (heads, sequence tile). Tiles 64 and 128 at 12 heads
#: are the fastest of ``scripts/lab/encoder_engine.py --attention``'s grid on the H100 (176 us against the
#: default's 200 at [2048, 64]; 377 against 395 at [2048, 128]); tile 32 takes tile 64's, not measured.
#: Shapes not listed take one head a program, 4 warps up to tile 64, 8 beyond.
ATTENTION_CONFIGS: dict[tuple[int, int], tuple[int, int]] = {(12, 32): (2, 4), (12, 64): (2, 4), (12, 128): (2, 8)}


def triton_attention(
    qkv: torch.Tensor, keep: torch.Tensor, heads: int, config: tuple[int, int] | None = None
) -> torch.Tensor:
    """The attention kernel on a call ``covers_attention`` accepts.

    Args:
        qkv: The QKV projection (see ``attention``).
        keep: The key mask.
        heads: Attention heads.
        config: ``(heads per program, warps)`` in place of ``attention_config``'s: for tuning.
    """
    b, s, three_h = qkv.shape
    h = three_h // 3
    d = h // heads
    if qkv.stride(1) != three_h or qkv.stride(2) != 1:
        qkv = qkv.contiguous()
    keep = _keep_bytes(keep)
    o = torch.empty((b, s, h), dtype=qkv.dtype, device=qkv.device)
    if b and s:
        block_s = max(16, next_pow2(s))
        group, warps = config or attention_config(heads, block_s)
        if heads % group:
            raise ValueError(f"{heads} heads do not divide into programs of {group}")
        _kernel("attention")[(b, heads // group)](
            qkv,
            keep,
            o,
            s,
            qkv.stride(0),
            qkv.stride(1),
            keep.stride(0),
            o.stride(0),
            o.stride(1),
            _LOG2E / math.sqrt(d),
            HEADS=heads,
            D=d,
            BLOCK_S=block_s,
            GROUP=group,
            num_warps=warps,
        )
    return o


def triton_varlen_attention(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, heads: int) -> torch.Tensor:
    """The attention kernel over sequences laid end to end (``varlen_attention``), ``max_len`` <= ``MAX_SEQ``."""
    t, three_h = qkv.shape
    h = three_h // 3
    if qkv.stride(0) != three_h or qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    o = torch.empty((t, h), dtype=qkv.dtype, device=qkv.device)
    n = cu_seqlens.shape[0] - 1
    shorter = 0
    for block_s in varlen_tiles(max_len):
        group, warps = attention_config(heads, block_s)
        if n and t:
            _kernel("varlen_attention")[(n, heads // group)](
                qkv,
                cu_seqlens,
                o,
                qkv.stride(0),
                o.stride(0),
                _LOG2E / math.sqrt(h // heads),
                shorter,
                HEADS=heads,
                D=h // heads,
                BLOCK_S=block_s,
                GROUP=group,
                num_warps=warps,
            )
        shorter = block_s
    return o


#: Tiles of the variable-length attention: one launch per tile, each taking the sequences whose length
#: falls between the previous tile and its own, so that a short sequence is not computed in the longest
#: one's tile. On the H100 at 12 heads of 32, 2,048 sequences of lengths 16-128: 252.8 us with (64, 128),
#: 262.6 with (32, 64, 128), 288.6 with one tile of 128; the padded kernel at [2,048, 128] 377.4
#: (``scripts/lab/encoder_engine.py --varlen``, results/engine-minilm-20261127).
VARLEN_TILES: tuple[int, ...] = (64, 128)


def varlen_tiles(max_len: int) -> list[int]:
    """The tiles of ``VARLEN_TILES`` below ``max_len``'s, then ``max_len``'s (a power of two from 16)."""
    top = max(16, next_pow2(max_len))
    return [t for t in VARLEN_TILES if t < top] + [top]


#: GELU of cuBLASLt's GEMM epilogue: the tanh form, within 4.7e-4 of the exact (erf) GELU everywhere (at 2.70,
#: where the value is 2.69 and half an fp16 step is 9.8e-4), so it changes an fp16 activation by rounding only.
def cublaslt_linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu(linear(x, w, b))`` as one cuBLASLt GEMM with the bias and GELU in its epilogue."""
    x2 = x.reshape(-1, x.shape[-1])
    y = torch._addmm_activation(b, x2, w.t(), use_gelu=True)
    return y.view(*x.shape[:-1], w.shape[0])


def triton_cls_attention(q: torch.Tensor, kv: torch.Tensor, keep: torch.Tensor, heads: int) -> torch.Tensor:
    """The one-query attention kernel on a call ``covers_attention`` accepts (for ``kv``)."""
    b, s, two_h = kv.shape
    h = two_h // 2
    d = h // heads
    if kv.stride(2) != 1 or kv.stride(1) != two_h:
        kv = kv.contiguous()
    if q.stride(-1) != 1:
        q = q.contiguous()
    keep = _keep_bytes(keep)
    o = torch.empty((b, h), dtype=kv.dtype, device=kv.device)
    if b and s:
        _kernel("cls_attention")[(b,)](
            q,
            kv,
            keep,
            o,
            s,
            q.stride(0),
            kv.stride(0),
            kv.stride(1),
            keep.stride(0),
            o.stride(0),
            _LOG2E / math.sqrt(d),
            HEADS=heads,
            D=d,
            BLOCK_S=max(16, next_pow2(s)),
            num_warps=4,
        )
    return o
