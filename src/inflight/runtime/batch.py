"""Batches, slots and the gather/scatter between requests and a slot's host buffers.

A *slot* holds one batch from gather to the last response: host input and output buffers
(pinned on the GPU), device buffers and events (owned by the runner), and the batch itself.
Everything is sized once for ``max_batch_size`` items and the largest sequence bucket; nothing is
allocated per request.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inflight.models.registry import ModelSpec, TensorSpec


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

    def pick(self, rows: int, seq: int | None) -> tuple[int, int | None]:
        """The ``(batch, seq)`` bucket for ``rows`` items of length ``seq``.

        Raises:
            ValueError: when ``rows`` or ``seq`` exceed the largest bucket.
        """
        i = bisect.bisect_left(self.batch, rows)
        if i == len(self.batch):
            raise ValueError(f"{rows} rows exceed the largest batch bucket {self.batch[-1]}")
        s: int | None = None
        if self.seq is not None:
            assert seq is not None
            j = bisect.bisect_left(self.seq, seq)
            if j == len(self.seq):
                raise ValueError(f"sequence length {seq} exceeds the largest bucket {self.seq[-1]}")
            s = self.seq[j]
        return self.batch[i], s


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
        bucket: ``(batch, seq)`` the batch is padded to.
        state: Runner-owned resources (device buffers, events).
        generation: How many batches this slot has carried.
    """

    index: int
    host_in: dict[str, np.ndarray]
    host_out: dict[str, np.ndarray]
    batch: Batch | None = None
    bucket: tuple[int, int | None] = (0, None)
    state: Any = None
    generation: int = 0


def gather(layout: Layout, slot: Slot, batch: Batch, bucket: tuple[int, int | None]) -> None:
    """Copy each request's inputs once into the slot's host buffers, padded to ``bucket``.

    Rows past the batch keep earlier valid contents (buffers start zeroed), so padding never
    holds out-of-range token ids; their outputs are never read.
    """
    rows, seq = bucket
    real = batch.rows
    for t in layout.spec.inputs:
        view = layout.view(slot.host_in[t.name], t, rows, seq)
        arrays = [item.inputs[t.name] for item in batch.items]
        if not t.variable or all(a.shape[1] == seq for a in arrays):
            # the common case (Triton batches equal shapes): one C-level copy for all requests
            np.concatenate(arrays, axis=0, out=view[:real])
            continue
        r = 0
        for item in batch.items:
            a = item.inputs[t.name]
            n = item.count
            if t.variable:
                s = a.shape[1]
                view[r : r + n, :s] = a
                if seq is not None and s < seq:
                    view[r : r + n, s:] = 0
            else:
                view[r : r + n] = a
            r += n
    slot.batch = batch
    slot.bucket = bucket


def outputs_for(layout: Layout, slot: Slot) -> list[dict[str, np.ndarray]]:
    """Per-request output views of the slot's host output buffers (no copy, padding excluded)."""
    assert slot.batch is not None
    rows, seq = slot.bucket
    views = {t.name: layout.view(slot.host_out[t.name], t, rows, seq) for t in layout.spec.outputs}
    out: list[dict[str, np.ndarray]] = []
    r = 0
    for item in slot.batch.items:
        out.append({name: v[r : r + item.count] for name, v in views.items()})
        r += item.count
    return out
