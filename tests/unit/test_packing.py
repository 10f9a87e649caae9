"""Packed bert_tiny rows against the unmodified model, one sequence at a time, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inflight.models.bert import HIDDEN, make_module, make_packed_module  # noqa: E402
from inflight.models.packing import assign, pack  # noqa: E402


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
