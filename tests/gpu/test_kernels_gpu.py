"""The fused Triton kernels on a real GPU: each against its definition, bert_tiny with them against the fp32 model."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

#: fp16/bf16 inputs, fp32 math: the kernels' results against the fp32 definition on the same inputs
TOL = {"float16": 4e-3, "bfloat16": 3e-2}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_each_kernel_matches_its_definition_and_is_what_the_operator_runs(dtype: str) -> None:
    import torch

    from inflight.models import kernels as K
    from inflight.models import triton_kernels as T

    dt = getattr(torch, dtype)
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=dev) * scale + shift).to(dt)

    h, ff = 128, 512
    w = [rnd(ff, h, scale=0.05), rnd(ff, scale=0.1), rnd(h, ff, scale=0.05), rnd(h, scale=0.1)]
    w += [rnd(h, scale=0.1, shift=1.0), rnd(h, scale=0.1)]
    for rows in (1, 37, 2048, 9000, 2048 * 64):
        x = rnd(rows, h)
        got = torch.ops.inflight.ffn_ln(x, *w, 1e-12)
        assert torch.equal(got, T.triton_ffn_ln(x, *w, 1e-12))  # the operator runs the kernel
        ref = K.ffn_ln_reference(x.float(), *(t.float() for t in w), 1e-12)
        assert (got.float() - ref).abs().max().item() <= TOL[dtype], rows
    for b, s in ((1, 16), (3, 37), (512, 64), (64, 100), (256, 128), (2, 200)):
        keep = torch.rand(b, s, generator=g, device=dev) > 0.3
        keep[:, 0] = True
        qkv = rnd(b, s, 3 * h)
        got = torch.ops.inflight.attention(qkv, keep, 2)
        ref = K.attention_reference(qkv.float(), keep, 2)
        assert (got.float() - ref).abs().max().item() <= TOL[dtype], (b, s)
        q, kv = rnd(b, h), rnd(b, s, 2 * h)
        got = torch.ops.inflight.cls_attention(q, kv, keep, 2)
        ref = K.cls_attention_reference(q.float(), kv.float(), keep, 2)
        assert (got.float() - ref).abs().max().item() <= TOL[dtype], (b, s)
        if s <= K.MAX_SEQ:
            assert torch.equal(got, T.triton_cls_attention(q, kv, keep, 2))


@pytest.mark.parametrize("seq", [16, 48, 64, 128, 192])
def test_bert_tiny_with_the_kernels_matches_the_fp32_model_at_every_length(seq: int) -> None:
    import numpy as np
    import torch

    from inflight.models.bert import SPEC, make_module

    x = SPEC.example_inputs(64, seq_len=seq, rng=np.random.default_rng(seq))
    args = [torch.from_numpy(x[t.name]) for t in SPEC.inputs]
    with torch.inference_mode():
        ref = make_module(0, cls_only=False, kernels=False)(*args).double()
        dev = [a.cuda() for a in args]
        fused = make_module(0).cuda().half()(*dev).double().cpu()
        unfused = make_module(0, kernels=False).cuda().half()(*dev).double().cpu()
    err, err_before = (fused - ref).abs().max().item(), (unfused - ref).abs().max().item()
    assert err <= 2e-2, (err, err_before)
    # no worse than the unfused ops in the same precision (one rounding instead of several)
    assert err <= 1.5 * err_before + 1e-3, (err, err_before)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_varlen_attention_and_the_gelu_epilogue_match_their_definitions(dtype: str) -> None:
    import torch

    from inflight.models import kernels as K
    from inflight.models import triton_kernels as T

    dt = getattr(torch, dtype)
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(1)
    # all-MiniLM-L6-v2's layer: 12 heads of 32, ffn 1536; lengths 16-128 laid end to end, a spare row after them
    lengths = torch.randint(16, 129, (300,), generator=g, device=dev)
    cu = torch.zeros(301, dtype=torch.int32, device=dev)
    cu[1:] = lengths.cumsum(0)
    t = int(cu[-1]) + 1
    qkv = torch.randn(t, 3 * 384, generator=g, device=dev).to(dt)
    got = torch.ops.inflight.varlen_attention(qkv, cu, 128, 12)
    # the operator runs the kernel (the spare row t - 1 is in no sequence: left as allocated)
    assert torch.equal(got[: t - 1], T.triton_varlen_attention(qkv, cu, 128, 12)[: t - 1])
    ref = K.varlen_attention_reference(qkv.float(), cu, 12)
    assert (got[: t - 1].float() - ref[: t - 1]).abs().max().item() <= TOL[dtype]
    x = torch.randn(4096, 384, generator=g, device=dev).to(dt)
    w, b = (torch.randn(1536, 384, generator=g, device=dev) * 0.05).to(dt), torch.randn(1536, device=dev).to(dt)
    got = torch.ops.inflight.linear_gelu(x, w, b).float()
    ref = K.linear_gelu_reference(x.float(), w.float(), b.float())
    # the epilogue's tanh GELU is within 4.7e-4 of erf's; fp16 rounds activations of ~3 by 2e-3
    assert (got - ref).abs().max().item() <= 4 * TOL[dtype] * max(1.0, ref.abs().max().item() / 4)


def test_minilm_shape_with_the_kernels_matches_the_fp32_model_padded_and_unpadded() -> None:
    import numpy as np
    import torch

    from inflight.models.bert import BertShape, make_module, make_unpadded_module
    from inflight.models.packing import unpad

    shape = BertShape(layers=6, hidden=384, heads=12, ffn=1536)
    opts = {"shape": shape, "pooling": "mean", "normalize": True}
    rng = np.random.default_rng(0)
    lengths = rng.integers(16, 129, 256)
    ids = rng.integers(1000, shape.vocab, (256, 128)).astype(np.int64)
    mask = (np.arange(128)[None, :] < lengths[:, None]).astype(np.int64)
    with torch.inference_mode():
        ref = make_module(0, kernels=False, **opts)(torch.from_numpy(ids), torch.from_numpy(mask)).double()
        padded = make_module(0, **opts).cuda().half()(torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda())
        u = unpad(list(ids), list(mask))
        unpadded = (
            make_unpadded_module(0, max_len=128, **opts)
            .cuda()
            .half()(*[torch.from_numpy(a).cuda() for a in u.arrays()])
        )
    for got in (padded, unpadded):
        cos = torch.nn.functional.cosine_similarity(got.double().cpu(), ref, dim=1)
        assert cos.min().item() >= 0.9999, cos.min().item()
