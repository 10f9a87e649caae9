"""Packing sequences of different lengths into rows, for the packed bert_tiny (``make_packed_module``).

A batch of mixed lengths padded to one length per launch wastes the padding (``padding_waste`` of
the mixed-length row in ``results/engine_bench.json``), and more, smaller launches cost more than
they save on the H200. Packing puts several sequences in one row
of ``row_len`` tokens (first fit, longest first), so one launch carries nearly only real tokens;
the model keeps each sequence's attention to its own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


#: What an unpadded launch costs beyond its token bucket, in padded-token equivalents: unpadding
#: on the device over every row of the engine's static input and the last layer over all of its
#: rows (fixed in size, so that one graph serves any number of rows). Fitted on the H200 with the
#: fused kernels (``results/engine-profile-20261124/engine_bench-kernels-cost-fit.json``): the
#: served unpadded launches took 332.0 us at a 35,776-token bucket and 465.6 us at 65,536 (about
#: 171 us plus 4.5 ns per token), the padded ones 249.1 us at 65,536 tokens and 446.8 us at
#: 131,072 (about 51 us plus 3.0 ns per token): about 40,000 padded tokens more.
UNPAD_COST_TOKENS = 40960

#: ``Buckets.unpad_token_cost`` on the H200, from the same rows: 4.5 ns per unpadded token against
#: 3.0 per padded one (FlashAttention's varlen kernel against the fused short-sequence attention
#: kernel of the padded launch, ``inflight.models.kernels``).
UNPAD_TOKEN_COST = 1.5


@dataclass(frozen=True)
class Packed:
    """Packed rows and where every sequence went.

    Attributes:
        input_ids: ``[rows, row_len]``.
        position_ids: ``[rows, row_len]``, each token's position in its own sequence.
        segment: ``[rows, row_len]``, 1..k for the row's k-th sequence, 0 for padding.
        attention_mask: ``[rows, row_len]``, each token's own mask bit, 0 for padding.
        cls_pos: ``[rows, per_row]``, where the row's k-th sequence starts (0 where it has none).
        place: ``[n, 2]``, (row, k) of sequence i: its output is ``out[row, k]``.
        real_tokens: Tokens of the sequences (their lengths summed).
    """

    input_ids: np.ndarray
    position_ids: np.ndarray
    segment: np.ndarray
    attention_mask: np.ndarray
    cls_pos: np.ndarray
    place: np.ndarray
    real_tokens: int

    @property
    def rows(self) -> int:
        """Rows of the packed batch."""
        return int(self.input_ids.shape[0])

    @property
    def padded_tokens(self) -> int:
        """Tokens the launch computes (rows x row length)."""
        return int(self.input_ids.size)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The model's inputs, in ``forward_packed``'s order."""
        return (self.input_ids, self.position_ids, self.segment, self.attention_mask, self.cls_pos)

    def unpack(self, out: np.ndarray) -> np.ndarray:
        """``out[rows, per_row, ...]`` of the model as ``[n, ...]`` in the sequences' order."""
        return out[self.place[:, 0], self.place[:, 1]]


@dataclass(frozen=True)
class Unpadded:
    """Sequences laid end to end with their masked tokens left out (``make_unpadded_module``'s input).

    Attributes:
        input_ids: ``[t]`` the kept tokens.
        position_ids: ``[t]`` each kept token's position in its own sequence.
        cu_seqlens: ``[n + 1]`` int32, where each sequence starts, then ``t``.
        max_len: The longest kept sequence.
        padded_tokens: Tokens the sequences had before (masked ones included).
    """

    input_ids: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    max_len: int
    padded_tokens: int

    @property
    def tokens(self) -> int:
        """Tokens the model computes (every one real)."""
        return int(self.input_ids.size)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The model's inputs, in ``forward_unpadded``'s order."""
        return (self.input_ids, self.position_ids, self.cu_seqlens)


def unpad(input_ids: Sequence[np.ndarray], attention_mask: Sequence[np.ndarray]) -> Unpadded:
    """Lay sequences (1-D arrays, one per sequence) end to end, keeping the tokens whose mask bit is set.

    Keys with mask 0 take no part in the padded model's attention and the output is the first
    token's state, so leaving them out computes the same outputs.

    Raises:
        ValueError: for a sequence whose first (CLS) token is masked: its state would be computed
            without it as a key in the padded model; unmask it or serve the padded model.
    """
    keep = [np.asarray(m) != 0 for m in attention_mask]
    bad = [i for i, k in enumerate(keep) if k.size == 0 or not k[0]]
    if bad:
        raise ValueError(
            f"sequence {bad[0]} (of {len(bad)}) has its first token masked or is empty: the unpadded model "
            "needs each sequence's CLS token unmasked; set attention_mask[0] = 1 or use the padded model"
        )
    ids = [np.asarray(x)[k] for x, k in zip(input_ids, keep, strict=True)]
    pos = [np.flatnonzero(k) for k in keep]
    lengths = np.array([len(x) for x in ids], np.int64)
    cu = np.zeros(len(ids) + 1, np.int32)
    np.cumsum(lengths, out=cu[1:])
    return Unpadded(
        input_ids=np.concatenate(ids).astype(np.int64),
        position_ids=np.concatenate(pos).astype(np.int64),
        cu_seqlens=cu,
        max_len=int(lengths.max()),
        padded_tokens=int(sum(len(x) for x in input_ids)),
    )


def unpad_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`unpad` on the device, with static shapes (what a CUDA graph can record).

    Row ``r``'s kept tokens (mask not 0) are laid end to end in row order. The outputs have room
    for ``tokens`` kept tokens plus one scratch slot (index ``tokens``): kept tokens past that room
    go to the scratch slot, and ``cu_seqlens`` is clipped at ``tokens``, so only the rows after the
    room is full lose tokens. The caller sizes ``tokens`` for the real rows (the rest of the rows
    are padding whose outputs are never read, best with an all-zero mask: empty sequences).

    Args:
        input_ids: ``[rows, seq]`` token ids.
        attention_mask: ``[rows, seq]`` mask bits.
        tokens: Room for kept tokens (a token bucket).

    Returns:
        ``input_ids [tokens + 1]``, ``position_ids [tokens + 1]`` (each token's position in its
        own row) and ``cu_seqlens [rows + 1]`` int32, as :func:`unpad` returns them.
    """
    import torch

    rows, seq = input_ids.shape
    keep = attention_mask.reshape(-1) != 0
    index = torch.cumsum(keep, 0) - 1
    # every masked token lands on the one scratch slot; measured on the H200 this scatter is 13-21 us
    # for 2,048 rows, and a gather through a binary search in place of it made inductor's fused
    # layer norm several times slower (results/engine-profile-20261124/p-unpadded-scatter-gather.json)
    dest = torch.where(keep & (index < tokens), index, tokens)
    ids = input_ids.new_zeros(tokens + 1).scatter_(0, dest, input_ids.reshape(-1))
    where = torch.arange(seq, device=input_ids.device).expand(rows, seq).reshape(-1)
    positions = input_ids.new_zeros(tokens + 1).scatter_(0, dest, where)
    ends = torch.cumsum(keep.view(rows, seq).sum(1), 0).clamp(max=tokens)
    cu = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)
    return ids, positions, cu


def forward_rows_unpadded(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, tokens: int) -> Any:
    """``model.forward_unpadded`` over padded rows, unpadded on the device by :func:`unpad_rows`.

    The output row ``r`` is row ``r``'s (the CLS state the padded model computes for it) when the
    real rows hold at most ``tokens`` kept tokens and each has its first token unmasked.
    """
    ids, positions, cu = unpad_rows(input_ids, attention_mask, tokens)
    return model.forward_unpadded(ids, positions, cu, input_ids.shape[1])


def assign(lengths: Sequence[int], row_len: int, per_row: int) -> list[list[int]]:
    """First-fit decreasing: rows of sequence indices, each row's lengths summing to at most ``row_len``.

    Raises:
        ValueError: for a sequence longer than a row, or ``per_row`` < 1.
    """
    if per_row < 1:
        raise ValueError(f"per_row={per_row}: a row holds at least one sequence")
    too_long = [n for n in lengths if n > row_len]
    if too_long:
        raise ValueError(f"a sequence of {max(too_long)} tokens does not fit a row of {row_len}; use longer rows")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        n = lengths[i]
        for r, left in enumerate(room):
            if left >= n and len(rows[r]) < per_row:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(row_len - n)
    return rows


def pack(input_ids: Sequence[np.ndarray], attention_mask: Sequence[np.ndarray], row_len: int, per_row: int) -> Packed:
    """Pack sequences (1-D arrays, one per sequence) into rows of ``row_len`` tokens.

    Args:
        input_ids: Token ids of each sequence.
        attention_mask: Mask bits of each sequence (same length as its ids).
        row_len: Tokens per row (at least the longest sequence).
        per_row: Most sequences in one row (the model's query slots per row).
    """
    lengths = [len(x) for x in input_ids]
    rows = assign(lengths, row_len, per_row)
    shape = (len(rows), row_len)
    ids = np.zeros(shape, np.int64)
    pos = np.zeros(shape, np.int64)
    seg = np.zeros(shape, np.int64)
    mask = np.zeros(shape, np.int64)
    cls = np.zeros((len(rows), per_row), np.int64)
    place = np.zeros((len(lengths), 2), np.int64)
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members):
            n = lengths[i]
            ids[r, at : at + n] = input_ids[i]
            mask[r, at : at + n] = attention_mask[i]
            pos[r, at : at + n] = np.arange(n)
            seg[r, at : at + n] = k + 1
            cls[r, k] = at
            place[i] = (r, k)
            at += n
    return Packed(ids, pos, seg, mask, cls, place, int(sum(lengths)))
