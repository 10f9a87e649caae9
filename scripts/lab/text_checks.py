"""Two GPU-host checks of issue 51, printed: the unpadded masked mean compiled and eager, and what tokenizing costs.

``python scripts/lab/text_checks.py pool`` (a GPU): ``mean_pool_varlen`` against a loop, eager and under
``torch.compile`` (dynamic shapes); then a two-layer encoder of all-MiniLM-L6-v2's width, mean-pooled, unpadded
against padded, eager and compiled. On an H100 (torch 2.11, 2026-11-27), before ``mean_pool_varlen`` ran eagerly
inside compiled modules, the compiled pool was off by 3.35e9 and the compiled encoder's cosine was 0.

``python scripts/lab/text_checks.py tokenize TOKENIZER.json``: 512 texts of 14-126 common words, tokenized by
``TextEncoder.encode_batch`` (16 requests of 32) and by ``tokenizers``' own ``encode_batch``; run it again with
``RAYON_NUM_THREADS=1`` for one thread. On the H100 host's 16 cores (2026-11-27): 22.8 and 16.0 us a text; with one
thread 212.4 and 229.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def pool_check() -> None:
    """Print the pooling's and the encoder's errors, eager and compiled (needs a CUDA device)."""
    import torch

    from inflight.models.architecture import Architecture
    from inflight.models.bert import BertShape
    from inflight.models.packing import forward_rows_unpadded
    from inflight.models.pooling import mean_pool_varlen

    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(1001, 8, device=dev)
    lens = torch.tensor([5, 0, 7, 300, 1, 0, 0], device=dev)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), lens.cumsum(0)]).to(torch.int32)
    ref = torch.stack(
        [x[int(cu[i]) : int(cu[i + 1])].mean(0) if lens[i] else torch.zeros(8, device=dev) for i in range(len(lens))]
    )
    compiled = torch.compile(mean_pool_varlen, dynamic=True)
    print(
        "pool: eager max error",
        (mean_pool_varlen(x, cu) - ref).abs().max().item(),
        "compiled",
        (compiled(x, cu) - ref).abs().max().item(),
    )
    shape = BertShape(layers=2, hidden=384, heads=12, ffn=1536)
    m = Architecture(shape=shape, pooling="mean", normalize=True).make(0).to(dev).half().eval()
    rows, seq = 64, 128
    lengths = torch.randint(4, seq + 1, (rows,), device=dev)
    mask = (torch.arange(seq, device=dev)[None] < lengths[:, None]).long()
    ids = torch.randint(1, 30000, (rows, seq), device=dev) * mask
    tokens = int(mask.sum()) + 64

    def unpadded(a: Any, b: Any) -> Any:
        return forward_rows_unpadded(m, a, b, tokens)

    def cos(a: Any, b: Any) -> float:
        return float(torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).min())

    with torch.inference_mode():
        padded = m(ids, mask)
        print(
            "encoder: unpadded against padded, cosine min eager",
            cos(unpadded(ids, mask), padded),
            "compiled",
            cos(torch.compile(unpadded, dynamic=True)(ids, mask), padded),
        )


def _median_s(call: Callable[[], object], n: int = 10) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tokenize_check(tokenizer: Path) -> None:
    """Print microseconds a text through ``TextEncoder`` and through ``tokenizers`` alone."""
    import tokenizers

    from inflight.loadtest.workload import WORDS
    from inflight.runtime.text import TextEncoder

    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(14, 127)))) for _ in range(512)]
    enc = TextEncoder(tokenizer, max_len=256)
    requests = [np.array([[t.encode()] for t in texts[i : i + 32]], dtype=np.object_) for i in range(0, 512, 32)]
    raw = tokenizers.Tokenizer.from_file(str(tokenizer))
    raw.no_padding()
    raw.enable_truncation(256)
    print(
        f"cores {os.cpu_count()}, RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS')}: us a text, "
        f"TextEncoder {_median_s(lambda: enc.encode_batch(requests)) / 512 * 1e6:.1f}, "
        f"tokenizers {_median_s(lambda: raw.encode_batch(texts)) / 512 * 1e6:.1f}"
    )


def main() -> None:
    """``pool`` or ``tokenize TOKENIZER``."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("what", choices=["pool", "tokenize"])
    p.add_argument("tokenizer", nargs="?", type=Path)
    a = p.parse_args()
    if a.what == "pool":
        pool_check()
    elif a.tokenizer is None:
        p.error("tokenize needs the path of a tokenizer.json")
    else:
        tokenize_check(a.tokenizer)


if __name__ == "__main__":
    main()
