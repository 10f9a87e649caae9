"""Custom operators of the served models: a linear layer fused with its exact GELU.

``inflight::linear_gelu(x, weight, bias)`` is ``F.gelu(F.linear(x, weight, bias))`` (the erf GELU,
not the tanh approximation). On the CPU, and on CUDA for shapes the kernel does not cover, it runs
exactly that. On CUDA it runs one Triton kernel that computes the GEMM tile in fp32, adds the bias
and applies the GELU before the single store, so the FFN's widest activation (``[tokens, 4 x
hidden]``) is written once instead of written by the GEMM, read and written again by the GELU.
In bert_tiny at 2,048 x 64 tokens that activation is 134 MB in fp16; the separate GELU kernel was
about 15% of the graph's time (``scripts/profile_engine.py``).

Importing this module registers the operator; a ``torch.export`` artifact that uses it can only be
loaded after that (``inflight.runtime.engines.torch_engine.load_module`` imports it).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.nn import functional as F

LOGGER = logging.getLogger(__name__)

#: Inner dimensions the kernel takes whole (one tile along K): a power of two up to this.
MAX_K = 256
_kernel: Any = None


@torch.library.custom_op("inflight::linear_gelu", mutates_args=())
def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(x @ weight.T + bias)`` with the exact (erf) GELU.

    Args:
        x: ``[..., K]``.
        weight: ``[N, K]`` (``nn.Linear`` layout).
        bias: ``[N]``.

    Returns:
        ``[..., N]`` in ``x``'s dtype.
    """
    return F.gelu(F.linear(x, weight, bias))


@linear_gelu.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def kernel_covers(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> bool:
    """Whether the Triton kernel computes this call (else the unfused ops do).

    Half or bfloat16 tensors on one CUDA device, the same dtype, K a power of two from 16 to
    ``MAX_K``, and rows of ``x`` and ``weight`` contiguous along K.
    """
    k = x.shape[-1]
    return (
        x.is_cuda
        and x.dtype in (torch.float16, torch.bfloat16)
        and weight.dtype == x.dtype
        and bias.dtype == x.dtype
        and weight.device == x.device
        and 16 <= k <= MAX_K
        and k & (k - 1) == 0
        and x.stride(-1) == 1
        and weight.is_contiguous()
        and bias.is_contiguous()
    )


def _triton_kernel() -> Any:
    """The Triton kernel, compiled on first use (Triton ships with PyTorch's CUDA wheels)."""
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton  # type: ignore[import-not-found]
    import triton.language as tl  # type: ignore[import-not-found]

    @triton.autotune(
        configs=[
            triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8),
            triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4),
            triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4),
            triton.Config({"BLOCK_M": 128, "BLOCK_N": 256}, num_warps=8),
            triton.Config({"BLOCK_M": 256, "BLOCK_N": 128}, num_warps=8),
        ],
        key=["N", "K"],
    )
    @triton.jit
    def linear_gelu_kernel(  # type: ignore[no-untyped-def]
        x_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        M,
        N,
        stride_xm,
        stride_ym,
        K: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        # N tiles vary fastest: the programs that share an x tile run together and find it in L2
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(x, tl.trans(w))
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        y = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        tl.store(
            y_ptr + rm[:, None] * stride_ym + rn[None, :],
            y.to(y_ptr.dtype.element_ty),
            mask=(rm[:, None] < M) & (rn[None, :] < N),
        )

    _kernel = linear_gelu_kernel
    return _kernel


def triton_linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The fused kernel on a call that ``kernel_covers``."""
    import triton

    k = x.shape[-1]
    n = weight.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m:

        def grid(meta: dict[str, Any]) -> tuple[int, int]:
            return (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, meta["BLOCK_M"]))

        _triton_kernel()[grid](x2, weight, bias, y, m, n, x2.stride(0), y.stride(0), K=k)
    return y.reshape(*x.shape[:-1], n)


@linear_gelu.register_kernel("cuda")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    if kernel_covers(x, weight, bias):
        return triton_linear_gelu(x, weight, bias)
    return F.gelu(F.linear(x, weight, bias))
