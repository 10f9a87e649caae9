"""``OverlapExecutor`` (mode ``overlap``): chunks of one batch overlapped on the GPU, answered in-band."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from inflight.errors import ShuttingDownError
from inflight.runtime.batch import Batch, Item, Slot
from inflight.runtime.pipeline.base import ExecutorBase
from inflight.runtime.pipeline.completion import collect
from inflight.runtime.pipeline.contract import (
    GATHER_FAILED,
    LAUNCH_FAILED,
    LOGGER,
    Ranges,
    ResponseSink,
)
from inflight.runtime.pipeline.ring import SlotRing
from inflight.runtime.runners import Runner


def chunk_bounds(counts: Sequence[int], chunk_items: int, max_chunks: int) -> list[tuple[int, int]]:
    """Cut a batch of requests into chunks of about ``chunk_items`` items, at request boundaries.

    Args:
        counts: Items per request, in batch order.
        chunk_items: Items a chunk aims for; a batch below 1.5 times this is one chunk.
        max_chunks: Most chunks per batch.

    Returns:
        ``(first, end)`` request indices of each chunk, in order, covering every request.
    """
    n = len(counts)
    if n == 0:
        return []
    total = sum(counts)
    k = max(1, min(max_chunks, n, round(total / max(1, chunk_items))))
    bounds: list[tuple[int, int]] = []
    lo = 0
    acc = 0
    for i, c in enumerate(counts):
        after = k - len(bounds) - 1  # chunks still to come after the open one
        # cut before request i where the running total passes this chunk's share (the boundary
        # nearer the share), or where the requests left are just enough for one chunk each
        share = total * (len(bounds) + 1) / k
        if after > 0 and acc > 0 and n - i >= after and (acc + c / 2 > share or n - i == after):
            bounds.append((lo, i))
            lo = i
        acc += c
    bounds.append((lo, n))
    return bounds


class OverlapExecutor(ExecutorBase):
    """Chunks of one batch overlapped on the GPU, answered in ``execute()``'s returned list.

    ``run`` cuts the batch into chunks (``chunk_bounds``); each chunk takes a slot of a
    ``SlotRing``, is gathered and launched, and the previous chunk is waited for, its outputs
    copied out of the slot (the slot is free again at once) and its requests' outcomes reported to
    the sink while the GPU runs the newer chunk. The overlap mode's sink builds each response into
    the list ``execute()`` returns (``contract.Returned``), so the Python backend ships them in one
    message per batch, the sync mode's cost per request. Nothing is in flight between two ``run`` calls,
    so it needs no completion thread and no senders.

    Args:
        runner: Device resources.
        slots: Ring size; at least 2 (a chunk is launched before the previous one is finished).
        chunk_items: Items a chunk aims for.
        max_chunks: Most chunks per batch.
        ranges: NVTX ranges.
    """

    def __init__(
        self, runner: Runner, *, slots: int, chunk_items: int, max_chunks: int, ranges: Ranges | None = None
    ) -> None:
        if slots < 2:
            raise ValueError("the overlap executor needs at least 2 slots (a chunk launches before the last one ends)")
        if chunk_items < 1 or max_chunks < 1:
            raise ValueError("chunk_items and max_chunks must be at least 1")
        super().__init__(runner, ranges)
        self.chunk_items = chunk_items
        self.max_chunks = max_chunks
        self.ring = SlotRing(runner.make_slots(slots), self.stats, self._lock, self.ranges)
        self.slots = self.ring.slots

    def in_flight(self) -> int:
        """Chunks on the device now (none between two ``run`` calls)."""
        return self.ring.in_flight()

    def close(self, timeout_s: float = 10.0) -> bool:
        """Refuse new batches and release the runner once no chunk is on the device; closing again does nothing.

        Returns:
            True when no chunk was left on the device.
        """
        if self._closed:
            return True
        self._closed = True
        stuck = self.ring.drain(time.monotonic() + timeout_s)
        if stuck:
            LOGGER.error("%d chunk(s) still on the device at close; its resources are left to the exit", len(stuck))
            return False
        self.runner.close()
        return True

    def run(self, batch: Batch, sink: ResponseSink) -> None:
        """Execute ``batch``, reporting each request's outcome to ``sink`` (by its handle) as its chunk ends.

        Never raises for a chunk's failure: the requests of a chunk that failed get
        ``sink.send(handle, None, message)``, and the other chunks carry on. The batch's values were
        checked by ``partition_values`` before.

        Raises:
            ClosedError: after ``close()``.
        """
        self._check_open()
        items = batch.items
        bounds = chunk_bounds([it.count for it in items], self.chunk_items, self.max_chunks)
        with self._lock:
            self.stats.overlap_batches += 1
        pending: deque[Slot] = deque()
        for ci, (lo, hi) in enumerate(bounds):
            last = ci == len(bounds) - 1
            slot = self._start(items[lo:hi], sink)
            if slot is not None:
                pending.append(slot)
            while len(pending) > (0 if last else 1):
                self._finish(pending.popleft(), sink)

    def _start(self, chunk: list[Item], sink: ResponseSink) -> Slot | None:
        """Gather and launch one chunk; report its requests' failure to ``sink`` when that fails."""
        try:
            slot = self.ring.acquire()
        except ShuttingDownError as e:
            for it in chunk:
                sink.send(it.handle, None, str(e))
            return None
        for step, failure in ((self._prepare, GATHER_FAILED), (lambda s, _: self._launch(s), LAUNCH_FAILED)):
            try:
                step(slot, Batch(chunk))
            except Exception as e:
                LOGGER.error("chunk of %d requests %s: %s", len(chunk), failure.what, e)
                self.ring.release(slot)
                for it in chunk:
                    sink.send(it.handle, None, failure.message(e))
                return None
        with self._lock:
            self.stats.chunks += 1
        return slot

    def _finish(self, slot: Slot, sink: ResponseSink) -> None:
        """Wait for one chunk, copy its outputs out, free its slot, report its requests' outcomes to ``sink``."""
        batch = slot.batch
        assert batch is not None
        outs, error, waited = collect(self.runner, self.ranges, slot, "wait")
        rows = list(slot.item_rows)
        with self._lock:
            if error is None:
                self.stats.device_wait_s += waited
                self.stats.inline_wait_s += waited
            else:
                self.stats.failed_batches += 1
        self.ring.release(slot)
        with self.ranges.range("respond"):
            for it, r in zip(batch.items, rows, strict=True):
                if outs is None:
                    sink.send(it.handle, None, error)
                else:
                    sink.send(it.handle, {name: v[r : r + it.count] for name, v in outs.items()}, None)
