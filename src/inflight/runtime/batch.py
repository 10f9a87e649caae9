"""Batches, slots and the gather/scatter between requests and a slot's host buffers.

A *slot* holds one batch from gather to the last response: host input and output buffers
(pinned on the GPU), device buffers and events (owned by the runner), and the batch itself.
Everything is sized once for ``max_batch_size`` items and the largest sequence bucket; nothing is
allocated per request.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inflight.errors import ValidationError
from inflight.models.packing import UNPAD_COST_TOKENS, UNPAD_TOKEN_COST
from inflight.models.spec import ModelSpec, TensorSpec


@dataclass(eq=False)
class Item:
    """One request inside a batch.

    Attributes:
        inputs: The request's input arrays (views of Triton's shared memory).
        count: Its number of items (batch dimension).
        seq: Its sequence length (variable-length models), else None.
        handle: Whatever the response sink needs to answer it (the pb_utils request).
    """

    inputs: Mapping[str, np.ndarray]
    count: int
    seq: int | None
    handle: Any


@dataclass(eq=False)
class Batch:
    """Requests executed together, in order; rows are assigned in the same order."""

    items: list[Item]

    @property
    def rows(self) -> int:
        """Total items."""
        return sum(i.count for i in self.items)

    @property
    def seq(self) -> int | None:
        """Longest sequence in the batch (None for fixed-shape models)."""
        seqs = [i.seq for i in self.items if i.seq is not None]
        return max(seqs) if seqs else None


def partition_values(spec: ModelSpec, items: Sequence[Item]) -> tuple[list[Item], list[tuple[Item, ValidationError]]]:
    """Split requests into those whose values the device may read and those it may not (the one place).

    Token ids outside the vocabulary and mask values other than 0 and 1 would fault on the device or
    be read out of bounds, so each mode calls this once per batch, before anything is submitted. One
    reduction per input over the whole batch (its inputs laid end to end); only when that finds a
    bad value is each request checked alone.

    Args:
        spec: The model (``ModelSpec.check_values``).
        items: The batch's requests, in order.

    Returns:
        The valid requests in order, and each bad one with the error that names its value.
    """
    if (spec.vocab_size is None and spec.mask_input is None) or not items:
        return list(items), []
    try:
        spec.check_values({t.name: np.concatenate([np.ravel(it.inputs[t.name]) for it in items]) for t in spec.inputs})
    except ValidationError:
        pass
    else:
        return list(items), []
    good: list[Item] = []
    bad: list[tuple[Item, ValidationError]] = []
    for it in items:
        try:
            spec.check_values(it.inputs)
        except ValidationError as e:
            bad.append((it, e))
        else:
            good.append(it)
    return good, bad


def pow2_buckets(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to and including ``limit`` (``limit`` appended when not a power of two)."""
    out = [1 << k for k in range(int(math.log2(limit)) + 1) if (1 << k) <= limit]
    if out[-1] != limit:
        out.append(limit)
    return tuple(out)


@dataclass(frozen=True)
class Buckets:
    """Batch and sequence buckets; a batch is padded up to the smallest bucket that holds it."""

    batch: tuple[int, ...]
    seq: tuple[int, ...] | None
    #: What one launch costs beyond its padded tokens, in padded-token equivalents (0: launches
    #: are free, so nothing is padded or merged that need not be, as on the CPU)
    launch_cost_tokens: int = 0
    #: Token buckets of unpadded launches (the engine leaves masked tokens out on the device and
    #: computes a launch at the smallest bucket that holds its kept tokens); empty: every launch is
    #: padded. With token buckets a batch's lengths are not grouped: one run at its longest bucket.
    tokens: tuple[int, ...] = ()
    #: What a token of an unpadded launch costs in tokens of a padded one (the varlen attention
    #: kernel is slower per token than the padded launch's; ``UNPAD_TOKEN_COST``)
    unpad_token_cost: float = UNPAD_TOKEN_COST
    #: What an unpadded launch costs beyond its tokens, in padded tokens (``UNPAD_COST_TOKENS`` for bert-tiny)
    unpad_cost_tokens: int = UNPAD_COST_TOKENS
    #: Kept tokens above which an unpadded launch runs at its own count rounded up to 64, not at a
    #: token bucket (the engine runs those eagerly: ``BackendParameters.graph_tokens``); 0: never
    exact_from: int = 0

    def pick(self, rows: int, seq: int | None) -> tuple[int, int | None]:
        """The ``(batch, seq)`` bucket for ``rows`` items of length ``seq``.

        Raises:
            ValueError: when ``rows`` or ``seq`` exceed the largest bucket.
        """
        i = bisect.bisect_left(self.batch, rows)
        if i == len(self.batch):
            raise ValueError(f"{rows} rows exceed the largest batch bucket {self.batch[-1]}")
        return self.batch[i], self.seq_bucket(seq)

    def token_bucket(self, tokens: int) -> int | None:
        """The smallest token bucket that holds ``tokens`` kept tokens (None when none does)."""
        i = bisect.bisect_left(self.tokens, tokens)
        return self.tokens[i] if i < len(self.tokens) else None

    def unpadded(self, tokens: int, rows: int, seq: int | None) -> int | None:
        """The token bucket to run a launch of ``rows`` bucket rows at length ``seq`` unpadded, or None (padded).

        The bucket is the kept tokens rounded up to ``EXACT_TOKENS_STEP`` past ``exact_from``. Unpadded
        when the bucket priced at ``unpad_token_cost`` padded tokens each, plus what an unpadded launch
        costs beyond its tokens (``unpad_cost_tokens``), is less than the padded launch's tokens (bucket
        rows x bucket length).
        """
        if not self.tokens or seq is None:
            return None
        if self.exact_from and tokens > self.exact_from:
            t: int | None = EXACT_TOKENS_STEP * math.ceil(tokens / EXACT_TOKENS_STEP)
        else:
            t = self.token_bucket(max(tokens, 1))
        if t is None or self.unpad_token_cost * t + self.unpad_cost_tokens >= rows * seq:
            return None
        return t

    def seq_bucket(self, seq: int | None) -> int | None:
        """The sequence bucket for length ``seq`` (None for fixed-shape models).

        Raises:
            ValueError: when ``seq`` exceeds the largest bucket.
        """
        if self.seq is None:
            return None
        assert seq is not None
        j = bisect.bisect_left(self.seq, seq)
        if j == len(self.seq):
            raise ValueError(f"sequence length {seq} exceeds the largest bucket {self.seq[-1]}")
        return self.seq[j]

    def split(self, rows: int, seq: int | None = None) -> tuple[list[tuple[int, int]], int]:
        """Cut ``rows`` items of one sequence bucket into launches of ``(real rows, batch bucket)``.

        Padding up to the bucket that holds the rest is weighed against cutting off the largest
        bucket that fits and launching the rest separately, with ``launch_cost_tokens`` as the
        price of a launch (1,160 rows at seq 64: 1,024 + 136 padded to 256, not 2,048).

        Returns:
            The launches and their cost in padded-token equivalents.
        """
        s = seq or 1
        out: list[tuple[int, int]] = []
        cost = 0
        left = rows
        while left > 0:
            i = bisect.bisect_left(self.batch, left)
            if i == len(self.batch):
                out.append((self.batch[-1], self.batch[-1]))
                cost += self.launch_cost_tokens + self.batch[-1] * s
                left -= self.batch[-1]
                continue
            fit = self.batch[i]
            padded = self.launch_cost_tokens + fit * s
            if i > 0:
                full = self.batch[i - 1]
                rest_fit = self.batch[bisect.bisect_left(self.batch, left - full)]
                if 2 * self.launch_cost_tokens + (full + rest_fit) * s < padded:
                    out.append((full, full))
                    cost += self.launch_cost_tokens + full * s
                    left -= full
                    continue
            out.append((left, fit))
            cost += padded
            break
        return out, cost


#: ``Buckets.launch_cost_tokens`` on a GPU: a graph replay, its copies and small-kernel overheads
#: (~30 us on an H200, where a bert_tiny token costs ~4 ns).
GPU_LAUNCH_COST_TOKENS = 8192

#: ``BackendParameters.graph_tokens`` when it is 0, in bert-tiny tokens (scaled by a model's token FLOPs): a
#: launch this large runs ~2 ms on an H100 or H200 (all-MiniLM-L6-v2: 38,836 tokens), well past what launching
#: its kernels one by one costs the CPU, so it runs eagerly at its own token count rather than padded to a bucket.
EAGER_FROM_TOKENS = 1 << 20
#: An eager unpadded launch's tokens are rounded up to a multiple of this (the kernels' alignment stays the same).
EXACT_TOKENS_STEP = 64


def token_buckets(limit: int, per_octave: int = 8, smallest: int = 1024) -> tuple[int, ...]:
    """Token buckets from ``smallest`` up to ``limit``, ``per_octave`` to each doubling, multiples of 64.

    A launch's kept tokens are padded to the next bucket: at most ``1 / per_octave`` more.
    """
    out: set[int] = set()
    k = 0
    while True:
        t = 64 * math.ceil(smallest * 2 ** (k / per_octave) / 64)
        if t >= limit:
            break
        out.add(t)
        k += 1
    out.add(limit)
    return tuple(sorted(out))


@dataclass(frozen=True)
class Group:
    """One launch of a batch: rows of one sequence bucket, padded to one batch bucket.

    A batch whose requests have different lengths is cut into groups, one or more per sequence
    bucket, so each runs at its own length. Each group's rows lie one after another in the
    slot's flat buffers: inputs at ``in_offset`` elements with the group's own row length,
    outputs at ``out_offset`` elements. Rows past ``rows`` up to ``bucket[0]`` are padding whose
    outputs are never read.

    Attributes:
        bucket: ``(batch bucket, seq bucket)`` the launch runs at.
        rows: Real rows.
        first_row: Row of the slot's outputs where the group starts.
        in_offset: Element offset of the group's rows in each flat input buffer.
        out_offset: Element offset of the group's rows in each flat output buffer.
        tokens: The token bucket when the launch runs unpadded (its masked tokens left out on the
            device, ``Buckets.tokens``), else None.
    """

    bucket: tuple[int, int | None]
    rows: int
    first_row: int
    in_offset: Mapping[str, int]
    out_offset: Mapping[str, int]
    tokens: int | None = None


class Layout:
    """How a model's tensors map to flat per-slot buffers."""

    def __init__(self, spec: ModelSpec, max_items: int, max_seq: int | None) -> None:
        self.spec = spec
        self.max_items = max_items
        self.max_seq = max_seq

    @staticmethod
    def per_item(t: TensorSpec, seq: int | None) -> int:
        """Elements of one item of ``t`` at sequence length ``seq``."""
        dims = [int(seq) if d == -1 and seq is not None else d for d in t.dims]
        if -1 in dims:
            raise ValueError(f"tensor {t.name!r} has a variable dimension: pass seq")
        return math.prod(dims)

    def capacity(self, t: TensorSpec) -> int:
        """Elements a slot buffer for ``t`` holds."""
        return self.max_items * self.per_item(t, self.max_seq)

    def nbytes(self, t: TensorSpec) -> int:
        """Bytes a slot buffer for ``t`` needs."""
        return self.capacity(t) * np.dtype(t.dtype).itemsize

    def view(self, flat: np.ndarray, t: TensorSpec, rows: int, seq: int | None) -> np.ndarray:
        """``flat`` seen as ``[rows, *item_shape(seq)]``."""
        shape = t.shape(rows, seq)
        return flat[: math.prod(shape)].reshape(shape)


@dataclass(eq=False)
class Slot:
    """One batch's home from gather until its outputs are back on the host.

    Attributes:
        index: Position in the ring.
        host_in: Flat host input buffers per input (pinned on the GPU).
        host_out: Flat host output buffers per output (pinned on the GPU).
        batch: The batch in flight, None when free.
        groups: The batch's launches (see ``Group``), in buffer order.
        item_rows: First output row of each of the batch's requests, in request order.
        in_elements: Elements of each flat input buffer the groups fill (the host-to-device copy).
        real_tokens: Items x their own sequence lengths (variable-length models), else items.
        padded_tokens: The same over what the launches compute (bucket rows x bucket length).
        state: Runner-owned resources (device buffers, events).
        generation: How many batches this slot has carried.
    """

    index: int
    host_in: dict[str, np.ndarray]
    host_out: dict[str, np.ndarray]
    batch: Batch | None = None
    groups: tuple[Group, ...] = ()
    item_rows: tuple[int, ...] = ()
    in_elements: dict[str, int] = field(default_factory=dict)
    real_tokens: int = 0
    padded_tokens: int = 0
    state: Any = None
    generation: int = 0

    @property
    def rows(self) -> int:
        """Real rows of the batch in the slot."""
        return sum(g.rows for g in self.groups)


def plan(layout: Layout, buckets: Buckets, batch: Batch) -> tuple[tuple[Group, ...], tuple[int, ...], dict[str, int]]:
    """Group a batch's requests by sequence bucket and lay the groups out in the flat buffers.

    Requests are bucketed by their own length; adjacent buckets are then merged (the shorter
    ones padded to the longer length) where that costs less than a launch of their own, by
    dynamic programming over ``Buckets.split`` costs. Each merged run is cut into launches. With
    token buckets (unpadded launches) the whole batch is one run at its longest bucket, cut only
    at the largest batch bucket; ``gather`` then marks the launches that run unpadded.

    Returns:
        The groups (sequence buckets in increasing order), each request's first output row, and
        the elements of each input buffer the groups fill.

    Raises:
        ValueError: when a request is longer than the largest sequence bucket or the batch has
            more rows than the buffers hold.
    """
    spec = layout.spec
    by_seq: dict[int | None, list[int]] = {}
    for i, item in enumerate(batch.items):
        by_seq.setdefault(buckets.seq_bucket(item.seq), []).append(i)
    order = sorted(by_seq, key=lambda s: -1 if s is None else s)
    splitter = buckets
    if buckets.tokens:  # unpadded launches leave the padding out: one run at the longest length, one launch
        runs = [(0, len(order))]  # per largest batch bucket (rows padded on the device cost little unpadded)
        splitter = dataclasses.replace(buckets, launch_cost_tokens=1 << 40)
    else:
        runs = _merge_runs(buckets, order, [sum(batch.items[i].count for i in by_seq[s]) for s in order])
    groups: list[Group] = []
    item_rows = [0] * len(batch.items)
    in_off = {t.name: 0 for t in spec.inputs}
    out_off = {t.name: 0 for t in spec.outputs}
    row = 0
    for lo, hi in runs:
        seq = order[hi - 1]
        first = row
        for s in order[lo:hi]:
            for i in by_seq[s]:
                item_rows[i] = row
                row += batch.items[i].count
        for real, bucket_rows in splitter.split(row - first, seq)[0]:
            groups.append(Group((bucket_rows, seq), real, first, dict(in_off), dict(out_off)))
            for t in spec.inputs:
                in_off[t.name] += real * layout.per_item(t, seq)
            for t in spec.outputs:
                out_off[t.name] += real * layout.per_item(t, seq)
            first += real
    if row > layout.max_items:
        raise ValueError(f"{row} rows exceed the slot's {layout.max_items}")
    return tuple(groups), tuple(item_rows), in_off


def _merge_runs(buckets: Buckets, seqs: list[int | None], rows: list[int]) -> list[tuple[int, int]]:
    """Cheapest partition of the sorted sequence buckets into runs ``[lo, hi)`` padded to ``seqs[hi - 1]``."""
    k = len(seqs)
    best = [0] + [0] * k
    cut = [0] * (k + 1)
    for j in range(1, k + 1):
        best[j] = -1
        total = 0
        for i in range(j, 0, -1):
            total += rows[i - 1]
            c = best[i - 1] + buckets.split(total, seqs[j - 1])[1]
            if best[j] < 0 or c < best[j]:
                best[j], cut[j] = c, i - 1
    runs: list[tuple[int, int]] = []
    j = k
    while j > 0:
        runs.append((cut[j], j))
        j = cut[j]
    return runs[::-1]


def gather(layout: Layout, buckets: Buckets, slot: Slot, batch: Batch) -> None:
    """Copy each request's inputs once into the slot's host buffers, grouped by sequence bucket.

    Each group's rows are contiguous at its own length (``Group``); a request shorter than its
    bucket is zero-padded (id 0, mask 0: masked positions do not change the outputs). Nothing is
    padded in rows: the engine pads a launch to its batch bucket on the device.

    Raises:
        ValueError: see ``plan``.
    """
    groups, item_rows, in_elements = plan(layout, buckets, batch)
    spec = layout.spec
    items = batch.items
    single = all(g.bucket[1] == groups[0].bucket[1] for g in groups)
    real_tokens = padded_tokens = 0
    for g in groups:
        padded_tokens += g.bucket[0] * (g.bucket[1] or 1)
    for item in items:
        real_tokens += item.count * (item.seq or 1)
    for t in spec.inputs:
        flat = slot.host_in[t.name]
        seq0 = groups[0].bucket[1]
        if single and (not t.variable or all(i.inputs[t.name].shape[1] == seq0 for i in items)):
            # the common case (one length): one C-level copy for all requests, in request order
            rows = in_elements[t.name] // layout.per_item(t, seq0)
            np.concatenate([i.inputs[t.name] for i in items], axis=0, out=layout.view(flat, t, rows, seq0))
            continue
        for i, item in enumerate(items):
            g = _group_of(groups, item_rows[i])
            seq = g.bucket[1]
            start = g.in_offset[t.name] + (item_rows[i] - g.first_row) * layout.per_item(t, seq)
            view = layout.view(flat[start:], t, item.count, seq)
            a = item.inputs[t.name]
            if t.variable:
                s = a.shape[1]
                view[:, :s] = a
                if seq is not None and s < seq:
                    view[:, s:] = 0
            else:
                view[...] = a
    if buckets.tokens and spec.mask_input is not None:
        groups = _choose_unpadded(layout, buckets, slot, groups)
        padded_tokens = sum(g.tokens or g.bucket[0] * (g.bucket[1] or 1) for g in groups)
    slot.batch = batch
    slot.groups = groups
    slot.item_rows = item_rows
    slot.in_elements = in_elements
    slot.real_tokens = real_tokens
    slot.padded_tokens = padded_tokens


def _choose_unpadded(layout: Layout, buckets: Buckets, slot: Slot, groups: tuple[Group, ...]) -> tuple[Group, ...]:
    """Mark the groups that run unpadded: kept tokens counted in the slot's mask, first tokens all unmasked.

    A row whose first (CLS) token is masked runs padded (its output would differ unpadded).
    """
    t = layout.spec.input(layout.spec.mask_input or "")
    flat = slot.host_in[t.name]
    out = []
    for g in groups:
        seq = g.bucket[1]
        mask = layout.view(flat[g.in_offset[t.name] :], t, g.rows, seq)
        kept = int(np.count_nonzero(mask))
        tokens = buckets.unpadded(kept, g.bucket[0], seq)
        if tokens is not None and mask[:, 0].all():
            g = dataclasses.replace(g, tokens=tokens)
        out.append(g)
    return tuple(out)


def _group_of(groups: tuple[Group, ...], row: int) -> Group:
    """The launch where output row ``row`` starts (a request may run on into the next launch of its run)."""
    for g in reversed(groups):
        if g.first_row <= row:
            return g
    raise AssertionError(f"row {row} is in no group")


def outputs_for(layout: Layout, slot: Slot) -> list[dict[str, np.ndarray]]:
    """Per-request output views of the slot's host output buffers (no copy, padding excluded)."""
    assert slot.batch is not None
    views = {t.name: layout.view(slot.host_out[t.name], t, slot.rows, None) for t in layout.spec.outputs}
    return [
        {name: v[r : r + item.count] for name, v in views.items()}
        for item, r in zip(slot.batch.items, slot.item_rows, strict=True)
    ]
