"""The fused linear + GELU operator's Triton kernel against the unfused ops, on a real GPU."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("m", "k", "n"), [(1, 128, 512), (7, 128, 512), (4099, 128, 384), (131072, 128, 512), (33, 64, 100)]
)
def test_kernel_matches_the_unfused_ops(m: int, k: int, n: int, dtype: str) -> None:
    import torch
    from torch.nn import functional as F

    from inflight.models.ops import kernel_covers, linear_gelu, triton_linear_gelu

    g = torch.Generator(device="cuda").manual_seed(m + n)
    dt = getattr(torch, dtype)
    x = torch.randn(m, k, device="cuda", generator=g).to(dt)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.1).to(dt)
    b = torch.randn(n, device="cuda", generator=g).to(dt)
    assert kernel_covers(x, w, b)
    exact = F.gelu(F.linear(x.double(), w.double(), b.double()))
    fused = triton_linear_gelu(x, w, b)
    unfused = F.gelu(F.linear(x, w, b))
    assert fused.dtype == dt and fused.shape == (m, n)
    # the kernel rounds once (from fp32), the unfused ops twice: it is at least as close to exact
    ulp = 2.0**-10 if dtype == "float16" else 2.0**-7
    scale = exact.abs().clamp_min(1.0)
    err_fused = float(((fused.double() - exact).abs() / scale).max())
    err_unfused = float(((unfused.double() - exact).abs() / scale).max())
    assert err_fused <= 2 * ulp, (err_fused, err_unfused)
    # the dispatcher sends CUDA calls to the kernel: the same bits as calling it directly
    assert torch.equal(linear_gelu(x, w, b), fused)


def test_shapes_the_kernel_does_not_cover_run_the_unfused_ops() -> None:
    import torch
    from torch.nn import functional as F

    from inflight.models.ops import kernel_covers, linear_gelu

    x = torch.randn(5, 100, device="cuda", dtype=torch.float16)  # K not a power of two
    w = torch.randn(64, 100, device="cuda", dtype=torch.float16)
    b = torch.randn(64, device="cuda", dtype=torch.float16)
    assert not kernel_covers(x, w, b)
    assert torch.equal(linear_gelu(x, w, b), F.gelu(F.linear(x, w, b)))
