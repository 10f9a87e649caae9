"""The issue path every executor shares: gather a batch into a slot, launch it, answer it in-band."""

from __future__ import annotations

import threading
import time
from typing import TypeVar

from inflight.errors import ClosedError, EngineError
from inflight.runtime.batch import Batch, Layout, Slot, gather, outputs_for
from inflight.runtime.pipeline.contract import LOGGER, NoRanges, Ranges, ResponseSink, failed_on_device
from inflight.runtime.pipeline.stats import ExecutorStats
from inflight.runtime.runners import Runner

_E = TypeVar("_E", bound="ExecutorBase")


class ExecutorBase:
    """The issue path every executor shares: gather a batch into a slot, launch it, or run it in-band.

    Waiting for a launched slot and copying its outputs out is ``completion.collect``'s (the completion
    thread's and the overlap executor's).

    An executor is a context manager: leaving the block closes it, and any use after ``close()``
    raises ``ClosedError`` (as Polygraphy's runners refuse use outside their activation).
    """

    def __init__(self, runner: Runner, ranges: Ranges | None = None) -> None:
        self.runner = runner
        self.layout: Layout = runner.layout
        self.stats = ExecutorStats()
        self.ranges: Ranges = ranges or NoRanges()
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self: _E) -> _E:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._closed:
            self.close()

    def close(self, timeout_s: float = 10.0) -> bool:  # pragma: no cover - every executor overrides it
        """Release everything; True when no work was left unfinished."""
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(
                f"{type(self).__name__} used after close(): the model is being unloaded; retry on another "
                "instance or after reload"
            )

    def _prepare(self, slot: Slot, batch: Batch) -> None:
        """Gather ``batch`` into ``slot`` (its values were checked by ``partition_values`` before submission)."""
        t0 = time.perf_counter()
        with self.ranges.range("gather"):
            try:
                gather(self.layout, self.runner.buckets, slot, batch)
            except ValueError as e:  # validated requests never get here; a bug if they do
                raise EngineError(f"batch does not fit the instance's buffers: {e}") from e
        took = time.perf_counter() - t0
        with self._lock:
            st = self.stats
            st.gather_s += took
            st.gather_max_s = max(st.gather_max_s, took)
            st.batches += 1
            st.requests += len(batch.items)
            st.items += slot.rows
            st.padded_items += sum(g.bucket[0] for g in slot.groups)
            st.launches += len(slot.groups)
            st.real_tokens += slot.real_tokens
            st.padded_tokens += slot.padded_tokens
            st.unpadded_launches += sum(g.tokens is not None for g in slot.groups)
            buckets = self.runner.buckets
            if buckets.seq is not None and len({buckets.seq_bucket(i.seq) for i in batch.items}) > 1:
                st.mixed_length_batches += 1
            st.batch_sizes.append(slot.rows)

    def _launch(self, slot: Slot) -> None:
        """Enqueue the slot's gathered batch on the device (raises what the runner raises)."""
        slot.generation += 1
        t0 = time.perf_counter()
        with self.ranges.range("enqueue"):
            replays = self.runner.launch(slot)
        seconds = time.perf_counter() - t0
        with self._lock:
            self.stats.launch_s += seconds
            self.stats.launch_max_s = max(self.stats.launch_max_s, seconds)
            if self.runner.replays_graphs:
                self.stats.graph_replays += replays
                self.stats.eager_launches += len(slot.groups) - replays

    def _count_sole_slot(self, t0: float) -> None:
        """Count an in-band launch on a slot no other thread uses (depth 1) and the time since ``t0`` as the slot's."""
        with self._lock:
            self.stats.depth_launches[1] += 1
            self.stats.max_depth = max(self.stats.max_depth, 1)
        self.stats.slot_s += time.perf_counter() - t0

    def _answer_in_band(self, slot: Slot, batch: Batch, sink: ResponseSink) -> None:
        """The sync path on ``slot``: gather, launch, wait for the device, report each request's outcome to ``sink``.

        The outputs ``sink`` gets are views of the slot's host buffers, valid only during ``send``. A
        batch that failed (gathering, launching or on the device) is logged once and each of its
        requests gets ``failed_on_device``'s message; the instance carries on.
        """
        try:
            self._prepare(slot, batch)
            self._launch(slot)
            t0 = time.perf_counter()
            with self.ranges.range("wait"):
                self.runner.wait(slot)
        except Exception as e:
            LOGGER.error("batch failed: %s", e)
            with self._lock:
                self.stats.failed_batches += 1
            error = failed_on_device(e)
            for item in batch.items:
                sink.send(item.handle, None, error)
            return
        waited = time.perf_counter() - t0
        with self._lock:
            self.stats.device_wait_s += waited
            self.stats.inline_wait_s += waited
            self.stats.wait_max_s = max(self.stats.wait_max_s, waited)
        t0 = time.perf_counter()
        with self.ranges.range("respond"):
            for item, out in zip(batch.items, outputs_for(self.layout, slot), strict=True):
                sink.send(item.handle, out, None)
        took = time.perf_counter() - t0
        with self._lock:
            self.stats.build_max_s = max(self.stats.build_max_s, took)
