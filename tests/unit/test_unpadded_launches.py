"""Unpadded launches on the CPU: the device-side unpadding, the batch plan that marks them, the outputs.

The GPU runs the same functions inside a CUDA graph (``tests/gpu/test_unpadded_gpu.py``); here
the model's CPU path (one masked attention in place of FlashAttention's varlen kernel) checks
that leaving masked tokens out of static padded rows gives every real row its padded output.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inflight.models.bert import SPEC, make_module  # noqa: E402
from inflight.models.packing import UNPAD_COST_TOKENS, forward_rows_unpadded, unpad, unpad_rows  # noqa: E402
from inflight.runtime.batch import (  # noqa: E402
    Batch,
    Buckets,
    Item,
    Layout,
    Slot,
    gather,
    pow2_buckets,
    token_buckets,
)


def _rows(rng: np.random.Generator, rows: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(1, seq + 1, size=rows)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    mask[:, 1:][rng.random((rows, seq - 1)) < 0.1] = 0  # some masked tokens inside the sequences too
    ids = rng.integers(1, 30522, size=(rows, seq)) * mask
    return ids, mask


def test_unpad_rows_lays_out_what_unpad_does_and_spills_only_past_its_room() -> None:
    rng = np.random.default_rng(1)
    ids, mask = _rows(rng, 9, 20)
    want = unpad(list(ids), list(mask))
    room = want.tokens + 5
    got_ids, got_pos, got_cu = (a.numpy() for a in unpad_rows(torch.from_numpy(ids), torch.from_numpy(mask), room))
    assert got_ids.shape == got_pos.shape == (room + 1,)
    np.testing.assert_array_equal(got_cu, want.cu_seqlens)
    np.testing.assert_array_equal(got_ids[: want.tokens], want.input_ids)
    np.testing.assert_array_equal(got_pos[: want.tokens], want.position_ids)
    # too little room: the first rows keep theirs, cu_seqlens stops at the room
    small = int(want.cu_seqlens[4])
    _, _, cu = unpad_rows(torch.from_numpy(ids), torch.from_numpy(mask), small)
    np.testing.assert_array_equal(cu.numpy()[:5], want.cu_seqlens[:5])
    assert cu.numpy().max() == small


def test_unpadded_rows_give_each_real_row_its_padded_output_whatever_the_padding_rows_hold() -> None:
    rng = np.random.default_rng(2)
    seq, real, static = 24, 11, 16
    ids, mask = _rows(rng, static, seq)
    full = make_module(0, cls_only=False).eval()
    model = make_module(0).eval()
    with torch.inference_mode():
        want = full(torch.from_numpy(ids[:real]), torch.from_numpy(mask[:real])).numpy()
        tokens = int(mask[:real].sum())
        for padding in ("stale", "empty"):
            m = mask.copy()
            if padding == "empty":  # what the engine does: the rows after the launch's are masked out
                m[real:] = 0
            got = forward_rows_unpadded(model, torch.from_numpy(ids), torch.from_numpy(m), tokens + 3).numpy()
            assert got.shape == (static, SPEC.outputs[0].dims[0])
            assert np.abs(got[:real] - want).max() <= 1e-5, padding
    assert np.abs(want[0] - want[1]).max() > 1e-3  # not vacuous: rows differ


def test_token_buckets_step_at_most_an_eighth_and_end_at_the_limit() -> None:
    b = token_buckets(2048 * 64)
    assert b[0] == 1024 and b[-1] == 2048 * 64
    assert all(t % 64 == 0 for t in b)
    assert all(hi / lo <= 1.125 + 64 / lo for lo, hi in itertools.pairwise(b))


def _batch(rng: np.random.Generator, lengths: list[int], per_request: int) -> Batch:
    items = []
    for k, s in enumerate(lengths):
        x = SPEC.example_inputs(per_request, seq_len=s, rng=rng)
        items.append(Item(inputs=x, count=per_request, seq=s, handle=k))
    return Batch(items)


def _slot(layout: Layout) -> Slot:
    return Slot(
        index=0,
        host_in={t.name: np.zeros(layout.capacity(t), t.dtype) for t in SPEC.inputs},
        host_out={t.name: np.zeros(layout.capacity(t), t.dtype) for t in SPEC.outputs},
    )


def test_gather_runs_a_mixed_batch_as_one_unpadded_launch_and_counts_its_tokens() -> None:
    rng = np.random.default_rng(3)
    layout = Layout(SPEC, 2048, 128)
    buckets = Buckets(pow2_buckets(2048), (16, 32, 64, 128), 8192, tokens=token_buckets(2048 * 128))
    batch = _batch(rng, [int(s) for s in rng.integers(16, 129, size=30)], 50)
    slot = _slot(layout)
    gather(layout, buckets, slot, batch)
    (g,) = slot.groups
    kept = sum(int(it.inputs["attention_mask"].sum()) for it in batch.items)
    assert g.bucket == (2048, 128) and g.rows == 1500
    assert g.tokens is not None and kept <= g.tokens <= kept * 1.125 + 64
    assert slot.padded_tokens == g.tokens < slot.real_tokens
    # without token buckets the same batch is grouped by length into several padded launches
    padded = _slot(layout)
    gather(layout, Buckets(pow2_buckets(2048), (16, 32, 64, 128), 8192), padded, batch)
    assert len(padded.groups) > 1 and all(x.tokens is None for x in padded.groups)


def test_a_launch_runs_padded_when_padding_is_small_or_a_first_token_is_masked() -> None:
    rng = np.random.default_rng(4)
    layout = Layout(SPEC, 2048, 128)
    buckets = Buckets(pow2_buckets(2048), (64,), 8192, tokens=token_buckets(2048 * 64))
    full = _batch(rng, [64] * 40, 50)
    for it in full.items:
        it.inputs["attention_mask"][:] = 1
    slot = _slot(layout)
    gather(layout, buckets, slot, full)
    assert slot.groups[0].tokens is None  # 2,000 of 2,048 rows, every token kept: padded is cheaper
    tails = _batch(rng, [64] * 40, 50)  # example inputs: masked tails of up to half the length
    gather(layout, buckets, slot, tails)
    assert slot.groups[0].tokens is None  # a quarter masked: not enough to pay the varlen kernel's price
    halves = _batch(rng, [64] * 40, 50)
    for it in halves.items:  # three quarters of every sequence masked
        it.inputs["attention_mask"][:, 16:] = 0
    gather(layout, buckets, slot, halves)
    assert slot.groups[0].tokens is not None
    free = Buckets(pow2_buckets(2048), (64,), 8192, tokens=token_buckets(2048 * 64), unpad_token_cost=0.0)
    gather(layout, free, slot, tails)
    assert slot.groups[0].tokens is not None
    halves.items[7].inputs["attention_mask"][3, 0] = 0
    gather(layout, buckets, slot, halves)
    assert slot.groups[0].tokens is None  # a masked CLS token: its output differs unpadded
    # small launches pay the fixed cost of the unpadded graph
    assert buckets.unpadded(100, 64, 64) is None
    assert buckets.unpadded(30_000, 2048, 64) is not None
    assert buckets.unpadded(64_000, 2048, 64) is None  # half the tokens masked: not enough to pay
    assert UNPAD_COST_TOKENS > 0


def test_bench_error_per_sequence_compares_each_sequence_alone() -> None:
    from inflight.bench.unpadded import _max_error_per_sequence

    rng = np.random.default_rng(6)
    ids = [rng.integers(1, 30522, size=n) for n in (5, 9, 12)]
    masks = [np.ones_like(x) for x in ids]
    full = make_module(0, cls_only=False).eval()
    with torch.inference_mode():
        got = np.stack(
            [
                full(torch.from_numpy(x[None]), torch.from_numpy(m[None])).numpy()[0]
                for x, m in zip(ids, masks, strict=True)
            ]
        )
    assert _max_error_per_sequence(got, ids, masks, full) <= 1e-6
    got[1, 3] += 0.5
    assert abs(_max_error_per_sequence(got, ids, masks, full) - 0.5) < 1e-5


def test_launches_past_exact_from_run_at_their_own_count_rounded_to_64() -> None:
    rng = np.random.default_rng(5)
    layout = Layout(SPEC, 2048, 128)
    exact_from = 40_000
    buckets = Buckets(
        pow2_buckets(2048), (16, 32, 64, 128), 8192, tokens=token_buckets(exact_from), exact_from=exact_from
    )
    assert buckets.tokens[-1] == exact_from  # graphs are captured up to it, not past it
    assert buckets.unpadded(40_000, 2048, 128) == buckets.token_bucket(40_000)
    assert buckets.unpadded(40_001, 2048, 128) == 40_064
    assert buckets.unpadded(145_027, 2048, 128) == 145_088  # the bucket above it is 155,904 (7.5% more)
    assert buckets.unpadded(145_027, 2048, 64) is None  # the cost rule still decides: 131,072 padded tokens
    batch = _batch(rng, [int(s) for s in rng.integers(16, 129, size=50)], 32)
    slot = _slot(layout)
    gather(layout, buckets, slot, batch)
    (g,) = slot.groups
    kept = sum(int(it.inputs["attention_mask"].sum()) for it in batch.items)
    assert kept > exact_from and g.tokens == 64 * -(-kept // 64)


def test_graph_tokens_default_scales_with_the_models_token_flops() -> None:
    import dataclasses

    from inflight.model_config import BackendParameters
    from inflight.models.architecture import Architecture
    from inflight.models.bert import BertShape
    from inflight.runtime.assembly import graph_tokens_for
    from inflight.runtime.batch import EAGER_FROM_TOKENS

    shape = BertShape(layers=6, hidden=384, heads=12, ffn=1536)
    minilm = dataclasses.replace(SPEC, extra={**SPEC.extra, "architecture": Architecture(shape=shape)})
    assert graph_tokens_for(BackendParameters(), SPEC) == EAGER_FROM_TOKENS  # bert-tiny: past its largest launch
    assert graph_tokens_for(BackendParameters(), minilm) == round(EAGER_FROM_TOKENS / 27)
    assert graph_tokens_for(BackendParameters(graph_tokens=5000), minilm) == 5000
