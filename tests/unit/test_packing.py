"""Packed and unpadded bert_tiny against the unmodified model, one sequence at a time, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inflight.models.bert import HIDDEN, make_module, make_packed_module, make_unpadded_module  # noqa: E402
from inflight.models.packing import assign, pack, unpad  # noqa: E402


def test_first_fit_decreasing_fills_rows_and_respects_both_limits() -> None:
    lengths = [100, 60, 50, 30, 28, 20, 16, 16, 16, 5]
    rows = assign(lengths, 128, per_row=3)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 128 and len(r) <= 3 for r in rows)
    assert rows[0][0] == 0  # longest first
    assert len(rows) == 4  # ten sequences, three per row at most
    assert len(assign(lengths, 128, per_row=10)) == 3  # 341 tokens: three rows of 128 are the fewest possible
    with pytest.raises(ValueError, match="130 tokens does not fit a row of 128"):
        assign([130], 128, 4)


def test_packed_rows_give_every_sequence_its_unpacked_output() -> None:
    rng = np.random.default_rng(4)
    lengths = [int(n) for n in rng.integers(1, 41, size=23)]
    ids = [rng.integers(1, 30522, size=n) for n in lengths]
    masks = []
    for n in lengths:  # each sequence keeps its first token and masks a random tail, as requests do
        m = np.ones(n, np.int64)
        m[max(1, int(rng.integers(1, n + 1))) :] = 0
        masks.append(m)
    p = pack(ids, masks, row_len=48, per_row=6)
    assert p.rows < len(lengths) and p.real_tokens == sum(lengths) and p.padded_tokens == p.rows * 48
    full = make_module(0, cls_only=False)
    packed = make_packed_module(0)
    with torch.inference_mode():
        out = packed(*[torch.from_numpy(a) for a in p.arrays()]).numpy()
        assert out.shape == (p.rows, 6, HIDDEN)
        got = p.unpack(out)
        for i, n in enumerate(lengths):
            want = full(torch.from_numpy(ids[i][None]), torch.from_numpy(masks[i][None])).numpy()[0]
            assert np.abs(got[i] - want).max() <= 1e-5, (i, n)
    # the check is not vacuous: another sequence's output differs
    assert np.abs(got[0] - got[1]).max() > 1e-3


def test_unpadded_sequences_give_every_sequence_its_padded_output() -> None:
    rng = np.random.default_rng(5)
    lengths = [int(n) for n in rng.integers(1, 41, size=19)]
    ids = [rng.integers(1, 30522, size=n) for n in lengths]
    masks = []
    for n in lengths:  # a masked tail, and some masked tokens in the middle too
        m = np.ones(n, np.int64)
        m[max(1, int(rng.integers(1, n + 1))) :] = 0
        m[1:][rng.random(n - 1) < 0.2] = 0
        masks.append(m)
    u = unpad(ids, masks)
    assert u.tokens == sum(int(m.sum()) for m in masks) < u.padded_tokens == sum(lengths)
    assert u.cu_seqlens.dtype == np.int32 and u.cu_seqlens[-1] == u.tokens and len(u.cu_seqlens) == len(ids) + 1
    full = make_module(0, cls_only=False)
    model = make_unpadded_module(0, max_len=48)
    with torch.inference_mode():
        got = model(*[torch.from_numpy(a) for a in u.arrays()]).numpy()
        assert got.shape == (len(ids), HIDDEN)
        for i, n in enumerate(lengths):
            want = full(torch.from_numpy(ids[i][None]), torch.from_numpy(masks[i][None])).numpy()[0]
            assert np.abs(got[i] - want).max() <= 1e-5, (i, n)
    assert np.abs(got[0] - got[1]).max() > 1e-3


def test_unpad_refuses_a_sequence_whose_cls_token_is_masked() -> None:
    ids = [np.arange(1, 5), np.arange(1, 4)]
    with pytest.raises(ValueError, match=r"sequence 1 .* first token masked"):
        unpad(ids, [np.ones(4, np.int64), np.array([0, 1, 1])])


def test_unpadded_batch_of_more_sequences_than_positions() -> None:
    rng = np.random.default_rng(6)
    ids = rng.integers(1, 30522, size=(600, 3))  # more sequences than the model has positions (512)
    mask = np.ones_like(ids)
    u = unpad(list(ids), list(mask))
    with torch.inference_mode():
        got = make_unpadded_module(0, max_len=3)(*[torch.from_numpy(a) for a in u.arrays()]).numpy()
        want = make_module(0, cls_only=False)(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    assert got.shape == want.shape == (600, HIDDEN)
    assert np.abs(got - want).max() <= 1e-5
