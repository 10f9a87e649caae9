"""The poolings of an encoder's output, as sentence-transformers computes them.

What :func:`inflight.models.bert.make_module` uses for ``pooling="mean"`` and ``normalize=True``:
sentence-transformers' ``Pooling`` (mean tokens) and ``Normalize`` modules. Importing this module does
not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: sentence-transformers' ``Normalize`` divides by ``max(norm, 1e-12)`` (``F.normalize``'s default).
NORMALIZE_EPS = 1e-12
#: sentence-transformers' ``Pooling`` divides a masked sum by ``max(count, 1e-9)``.
MEAN_COUNT_MIN = 1e-9


def mean_pool(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The masked mean of token states, fp32: ``sum(x[mask == 1]) / count`` per row.

    Args:
        x: ``[b, s, h]`` token states.
        attention_mask: ``[b, s]`` 0/1.

    Returns:
        ``[b, h]`` float32 (a row without any unmasked token: zeros).
    """
    import torch

    w = attention_mask.to(torch.float32)[..., None]
    return (x.float() * w).sum(1) / w.sum(1).clamp(min=MEAN_COUNT_MIN)


def mean_pool_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The mean of each sequence's token states over sequences laid end to end, fp32.

    Static shapes and no host synchronisation (CUDA-graph capturable): each token's sequence number
    comes from a binary search of ``cu_seqlens`` on the device, and the tokens past
    ``cu_seqlens[-1]`` (an unpadded launch's spare room and scratch slot) are summed into a bucket
    that is dropped. It always runs eagerly, also inside a compiled module: on an H100 (torch
    2.11, inductor, dynamic shapes) the compiled ``index_add_`` of this function gave sums off by
    up to 3e9 while the eager one matched a loop to 9e-8 (``tests/gpu/test_minilm_gpu.py``
    found it: cosine 0 against sentence-transformers on the unpadded launches only).

    Args:
        x: ``[t, h]`` token states; sequence i is ``x[cu_seqlens[i]:cu_seqlens[i + 1]]``.
        cu_seqlens: ``[n + 1]`` where each sequence starts, then its end.

    Returns:
        ``[n, h]`` float32 (an empty sequence: zeros).
    """
    import torch

    return torch.compiler.disable(_mean_pool_varlen)(x, cu_seqlens)


def _mean_pool_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    import torch

    n = cu_seqlens.shape[0] - 1
    ends = cu_seqlens[1:].contiguous()
    tokens = torch.arange(x.shape[0], dtype=cu_seqlens.dtype, device=cu_seqlens.device)
    seq = torch.searchsorted(ends, tokens, right=True)  # n for the tokens past the last sequence
    sums = torch.zeros(n + 1, x.shape[-1], dtype=torch.float32, device=x.device).index_add_(0, seq, x.float())
    counts = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.float32).clamp(min=MEAN_COUNT_MIN)
    return sums[:n] / counts[:, None]


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """``x / max(||x||_2, 1e-12)`` along the last axis (sentence-transformers' ``Normalize``)."""
    from torch.nn import functional as F

    return F.normalize(x, p=2.0, dim=-1, eps=NORMALIZE_EPS)
