"""The fused operators of ``inflight.models.kernels``: CPU definitions, and the Triton kernels interpreted.

The interpreter (``TRITON_INTERPRET=1``) runs the kernels' own code on the CPU with numpy, so the
kernels' indexing, masking and arithmetic are checked here without a GPU; the GPU suite
(``tests/gpu/test_kernels_gpu.py``) checks the compiled kernels, bf16 included (the interpreter's
``tl.dot`` has no bf16).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from inflight.models import kernels as K
from inflight.models import triton_kernels as T


def _weights(h: int, ff: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return tuple(
        t.to(dtype)
        for t in (
            torch.randn(ff, h, generator=g) * 0.05,
            torch.randn(ff, generator=g) * 0.1,
            torch.randn(h, ff, generator=g) * 0.05,
            torch.randn(h, generator=g) * 0.1,
            1 + torch.randn(h, generator=g) * 0.1,
            torch.randn(h, generator=g) * 0.1,
        )
    )


def test_operators_on_the_cpu_are_their_definitions() -> None:
    x = torch.randn(5, 7, 32)
    w = _weights(32, 128, torch.float32)
    assert torch.equal(torch.ops.inflight.ffn_ln(x, *w, 1e-12), K.ffn_ln_reference(x, *w, 1e-12))
    qkv = torch.randn(3, 9, 96)
    keep = torch.rand(3, 9) > 0.3
    keep[:, 0] = True
    assert torch.equal(torch.ops.inflight.attention(qkv, keep, 2), K.attention_reference(qkv, keep, 2))
    q, kv = torch.randn(3, 32), torch.randn(3, 9, 64)
    assert torch.equal(torch.ops.inflight.cls_attention(q, kv, keep, 2), K.cls_attention_reference(q, kv, keep, 2))
    x, w1, b1 = torch.randn(4, 6, 32), torch.randn(128, 32), torch.randn(128)
    assert torch.equal(torch.ops.inflight.linear_gelu(x, w1, b1), K.linear_gelu_reference(x, w1, b1))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    qkv = torch.randn(10, 96)
    got = torch.ops.inflight.varlen_attention(qkv, cu, 5, 2)
    assert torch.equal(got, K.varlen_attention_reference(qkv, cu, 2))
    # each sequence alone: the padded operator on it
    for lo, hi in ((0, 4), (4, 9)):
        alone = K.attention_reference(qkv[None, lo:hi], torch.ones(1, hi - lo, dtype=torch.bool), 2)[0]
        torch.testing.assert_close(got[lo:hi], alone)


def test_varlen_attention_and_the_attention_grid_refuse_what_they_cannot_do() -> None:
    assert T.attention_config(12, 64) == (2, 4) and T.attention_config(2, 64) == (1, 4)
    assert T.varlen_tiles(128) == [64, 128] and T.varlen_tiles(37) == [64] and T.varlen_tiles(5) == [16]
    with pytest.raises(ValueError, match="do not divide"):
        T.triton_attention(torch.zeros(1, 16, 3 * 96, dtype=torch.float16), torch.ones(1, 16), 3, (2, 4))


def test_coverage_names_what_the_kernels_take() -> None:
    w = _weights(128, 512, torch.float16)
    assert K.covers_ffn_ln(torch.zeros(4, 128, dtype=torch.float16), w[0], w[2])
    assert not K.covers_ffn_ln(torch.zeros(4, 128), *_weights(128, 512, torch.float32)[0:3:2])  # fp32
    assert not K.covers_ffn_ln(torch.zeros(4, 96, dtype=torch.float16), *_weights(96, 384, torch.float16)[0:3:2])
    qkv = torch.zeros(2, 64, 384, dtype=torch.float16)
    assert K.covers_attention(qkv, 64, 64) and K.covers_attention(qkv, 64, K.MAX_SEQ)
    assert not K.covers_attention(qkv, 64, K.MAX_SEQ + 1)  # long sequences: PyTorch's flash attention
    assert not K.covers_attention(qkv, 48, 64)
    assert T.ffn_block_rows(2048 * 64) == (64, 4) and T.ffn_block_rows(2048)[0] == 16


_INTERPRETED = textwrap.dedent(
    """
    import json, torch
    from inflight.models import kernels as K
    from inflight.models import triton_kernels as T
    g = torch.Generator().manual_seed(0)
    dt = torch.float16
    out = {}
    h, ff = 128, 512
    w = [t.to(dt) for t in (torch.randn(ff, h, generator=g) * 0.05, torch.randn(ff, generator=g) * 0.1,
         torch.randn(h, ff, generator=g) * 0.05, torch.randn(h, generator=g) * 0.1,
         1 + torch.randn(h, generator=g) * 0.1, torch.randn(h, generator=g) * 0.1)]
    for m in (1, 37, 300):
        x = torch.randn(m, h, generator=g).to(dt)
        got = T.triton_ffn_ln(x, *w, 1e-12).float()
        ref = K.ffn_ln_reference(x.float(), *(t.float() for t in w), 1e-12)
        out[f"ffn_ln rows={m}"] = (got - ref).abs().max().item()
    # a strided input: the CLS rows of [b, s, h] states
    xs = torch.randn(6, 5, h, generator=g).to(dt)
    got = T.triton_ffn_ln(xs[:, 0], *w, 1e-12).float()
    ref = K.ffn_ln_reference(xs[:, 0].float(), *(t.float() for t in w), 1e-12)
    out["ffn_ln strided rows"] = (got - ref).abs().max().item()
    got = T.triton_ffn_ln(x, *w, 1e-12, config=(16, 64, 4, 2, "libdevice")).float()
    ref = K.ffn_ln_reference(x.float(), *(t.float() for t in w), 1e-12)
    out["ffn_ln libdevice erf"] = (got - ref).abs().max().item()
    for b, s in ((3, 64), (2, 37), (1, 128), (2, 16)):
        keep = torch.rand(b, s, generator=g) > 0.3
        keep[:, 0] = True
        qkv = torch.randn(b, s, 3 * h, generator=g).to(dt)
        got = T.triton_attention(qkv, keep, 2).float()
        out[f"attention b={b} s={s}"] = (got - K.attention_reference(qkv.float(), keep, 2)).abs().max().item()
        q, kv = torch.randn(b, h, generator=g).to(dt), torch.randn(b, s, 2 * h, generator=g).to(dt)
        got = T.triton_cls_attention(q, kv, keep.long(), 2).float()
        ref = K.cls_attention_reference(q.float(), kv.float(), keep, 2)
        out[f"cls_attention b={b} s={s}"] = (got - ref).abs().max().item()
    # sequences laid end to end (lengths 5, 1, 37, 0, 16) and a spare row in no sequence; 12 heads of 32 in
    # programs of 2 heads (the measured configuration at 12 heads) and of 1
    cu = torch.tensor([0, 5, 6, 43, 43, 59], dtype=torch.int32)
    qkv = torch.randn(60, 3 * 384, generator=g).to(dt)
    ref = K.varlen_attention_reference(qkv.float(), cu, 12)[:59]
    got = T.triton_varlen_attention(qkv, cu, 37, 12).float()[:59]
    out["varlen_attention 12 heads"] = (got - ref).abs().max().item()
    saved = T.VARLEN_TILES
    T.VARLEN_TILES = (128,)  # one tile for every length
    got = T.triton_varlen_attention(qkv, cu, 37, 12).float()[:59]
    T.VARLEN_TILES = saved
    out["varlen_attention one tile"] = (got - ref).abs().max().item()
    keep = torch.ones(2, 64, dtype=torch.bool)
    keep[1, 40:] = False
    qkv = torch.randn(2, 64, 3 * 384, generator=g).to(dt)
    for config in ((2, 4), (3, 2)):
        got = T.triton_attention(qkv, keep, 12, config).float()
        ref = K.attention_reference(qkv.float(), keep, 12)
        out[f"attention 12 heads config={config}"] = (got - ref).abs().max().item()
    print(json.dumps(out))
    """
)


def test_kernels_match_their_definitions_in_the_triton_interpreter() -> None:
    pytest.importorskip(
        "triton", reason="Triton is not installed (pip install triton): its interpreter runs the kernels"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    errors = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(errors) == 17
    # fp16 inputs, fp32 math, one rounding at the store: within fp16's resolution of the fp32 result
    bad = {k: v for k, v in errors.items() if not v <= 4e-3}
    assert not bad, bad
