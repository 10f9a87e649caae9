"""The packed bert_tiny on a real GPU: the bench's packed row against the fp32 CPU model."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_packed_mixed_row_matches_the_unpacked_model_and_times_a_graph() -> None:
    from inflight.bench.unpadded import packed_mixed_row
    from inflight.models.bert import SPEC, make_module
    from inflight.runtime.batch import Batch, Item

    rng = np.random.default_rng(3)
    items = []
    for k in range(12):  # requests of 5 items, each request its own length in 16..128
        seq = int(rng.integers(16, 129))
        items.append(Item(inputs=SPEC.example_inputs(5, seq_len=seq, rng=rng), count=5, seq=seq, handle=k))
    row = packed_mixed_row(Batch(items), 128, "fp16", 0, make_module(0, cls_only=False), iters=5, warmup=2)
    assert row["real_tokens"] == sum(it.count * it.seq for it in items)
    assert row["padded_tokens"] == row["rows"] * 128 >= row["real_tokens"]
    assert row["seconds_per_batch"] > 0 and row["tokens_per_s"] > 0
    assert row["max_abs_error_vs_fp32_cpu"] <= 2e-2


def test_unpadded_row_matches_the_padded_model_and_computes_only_unmasked_tokens() -> None:
    from inflight.bench.unpadded import unpadded_row
    from inflight.models.bert import SPEC, make_module
    from inflight.runtime.batch import Batch, Item

    rng = np.random.default_rng(4)
    items = []
    for k in range(12):
        seq = int(rng.integers(16, 129))
        items.append(Item(inputs=SPEC.example_inputs(5, seq_len=seq, rng=rng), count=5, seq=seq, handle=k))
    batch = Batch(items)
    row = unpadded_row(batch, "fp16", 0, make_module(0, cls_only=False), iters=5, warmup=2)
    assert row["real_tokens"] == sum(it.count * it.seq for it in items)
    assert row["computed_tokens"] == sum(int(it.inputs["attention_mask"].sum()) for it in items) < row["real_tokens"]
    assert row["seconds_per_batch"] > 0 and row["max_len"] <= 128
    assert row["max_abs_error_vs_fp32_cpu"] <= 2e-2
