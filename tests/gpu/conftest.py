"""GPU tests share one pytest process: what one test's tensors left in PyTorch's cache is given back after it."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def release_cached_gpu_memory() -> Iterator[None]:
    """Empty PyTorch's CUDA cache after each test.

    The caching allocator keeps what a test freed reserved for this process. On an H100 (2026-11-28) the
    in-process kernel and executor tests had left 51.9 GiB reserved when test_memory_gpu drove the built
    bert_small_inflight, sized at build time from the card's free memory, and its largest launches ran out of
    memory: the card was full of this process's cache, not the server's.
    """
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
