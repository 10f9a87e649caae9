"""``PipelinedExecutor``: a ring of slots, several batches in flight, responses through the sink.

One batch's walk: ``submit`` (the execute thread) takes a free slot of the ``SlotRing``, gathers and
launches it (``ExecutorBase``) and hands the slot to the ``Completion`` thread; that waits for it
(``completion.collect``), returns the slot to the ring and forwards the batch's responses to the
``ResponsePool``, whose sender threads answer each request through the sink. Each stage is built
with the next one it forwards to; none calls back into the executor.
"""

from __future__ import annotations

import contextlib
import time

from inflight.errors import ShuttingDownError
from inflight.runtime.batch import Batch, Slot
from inflight.runtime.pipeline.base import ExecutorBase
from inflight.runtime.pipeline.completion import Completion
from inflight.runtime.pipeline.contract import (
    GATHER_FAILED,
    LAUNCH_FAILED,
    LOGGER,
    UNLOADED_BEFORE_COMPLETION,
    Ranges,
    ResponseSink,
    Unlaunched,
)
from inflight.runtime.pipeline.gate import IssueGate
from inflight.runtime.pipeline.responses import Outgoing, ResponsePool
from inflight.runtime.pipeline.ring import SlotRing
from inflight.runtime.runners import Runner


class PipelinedExecutor(ExecutorBase):
    """A ring of slots; ``submit`` returns once the batch is enqueued, ``run`` answers one in-band.

    Composed of a ``SlotRing``, a ``Completion`` thread and a ``ResponsePool``; the threads start with the
    first ``submit``, so an instance that answers every batch in-band (``run``) has none. A slot is busy only
    while its batch is on the device: once the output event fired, the completion thread copies
    the batch's outputs out of the slot's pinned buffer (one copy per output per batch), frees
    the slot, and queues the responses for the sender threads. So the GPU is never held up by the
    response path, and the response path is bounded separately: at most ``response_backlog``
    batches wait for their responses; beyond that the completion thread waits (counted), slots
    stay busy, and ``submit`` waits for a slot (counted) — back-pressure reaches Triton's queue,
    nothing is dropped.

    Args:
        runner: Device resources.
        sink: Sends responses.
        slots: Ring size.
        response_threads: Sender threads.
        response_backlog: Batches whose responses may wait for the senders at once.
        yield_to_issue: Sender threads build a response only while the issue path is idle
            (see ``issuing``). All of them share the GIL with the execute thread, which is the
            one thread that decides throughput; measured on the H200, letting eight senders
            contend with it made the gather step six times slower.
        ranges: NVTX ranges.
    """

    def __init__(
        self,
        runner: Runner,
        sink: ResponseSink,
        *,
        slots: int,
        response_threads: int,
        response_backlog: int = 8,
        yield_to_issue: bool = True,
        ranges: Ranges | None = None,
    ) -> None:
        super().__init__(runner, ranges)
        if slots < 1 or response_threads < 1 or response_backlog < 1:
            raise ValueError("slots, response_threads and response_backlog must be at least 1")
        self.sink = sink
        # the stages, each built with what it hands work to: the ring lets the senders run while the issue
        # path waits for a slot (the gate), the completion thread frees slots into the ring and forwards the
        # responses to the pool, whose senders wait on the gate
        self.gate = IssueGate(yield_to_issue)
        self.pool = ResponsePool(
            sink,
            self.stats,
            self._lock,
            self.ranges,
            self.gate,
            threads=response_threads,
            backlog=response_backlog,
        )
        self.ring = SlotRing(runner.make_slots(slots), self.stats, self._lock, self.ranges, self.gate.waiting)
        self.slots = self.ring.slots
        self.completion = Completion(runner, self.ranges, self.ring.release, self.pool.dispatch, self.stats, self._lock)
        self._submitted = False  # set by the first ``submit`` (only the execute thread reads and writes it)

    def issuing(self) -> contextlib.AbstractContextManager[None]:
        """Wrap each ``execute()`` in it: the senders hold off meanwhile (``IssueGate.issuing``)."""
        return self.gate.issuing()

    def in_flight(self) -> int:
        """Slots currently holding a batch on the device."""
        return self.ring.in_flight()

    def close(self, timeout_s: float = 10.0) -> bool:
        """Stop accepting batches, drain in-flight ones, fail what cannot finish, free everything.

        Batches still on the device after ``timeout_s`` get an explicit error response per request;
        responses already queued are sent before the sender threads stop. The runner is closed only
        when nothing can touch its buffers any more; closing again does nothing.

        Returns:
            True when every in-flight batch completed normally.
        """
        if self._closed:
            return True
        self._closed = True
        deadline = time.monotonic() + timeout_s
        self.gate.open()
        stuck = self.ring.drain(deadline)
        if stuck:
            LOGGER.error(
                "%d batch(es) still in flight after %.1f s; failing their requests explicitly", len(stuck), timeout_s
            )
            for s in stuck:
                if s.batch is not None:
                    for item in s.batch.items:
                        with contextlib.suppress(Exception):
                            self.sink.send(item.handle, None, UNLOADED_BEFORE_COMPLETION)
        self.completion.stop(deadline)
        self.pool.stop(deadline)
        alive = [t.name for t in (self.completion.thread, *self.pool.threads) if t.is_alive()]
        if alive:
            LOGGER.error("threads still running at close (blocked on the device?): %s", alive)
        if not stuck and not alive:
            self.runner.close()
        else:
            LOGGER.error("device resources left to the process exit because work is still queued on the device")
        return not stuck

    def submit(self, batch: Batch) -> None:
        """Gather ``batch`` into a free slot, launch it, hand it to the completion thread.

        A batch that fails before it reaches the device is answered with errors through the sink.

        Raises:
            ShuttingDownError: when the executor is closing (the caller fails the requests);
                ``ClosedError`` once it is closed.
        """
        self._check_open()
        self._submitted = True  # from now on the completion thread frees slots: ``run`` goes through the ring
        self.pool.start()  # the first deferred batch starts the senders (and, handed over, the completion thread)
        slot = self.ring.acquire()
        try:
            self._prepare(slot, batch)
        except Exception as e:
            self._fail_unlaunched(slot, batch, GATHER_FAILED, e)
            return
        try:
            self._launch(slot)
        except Exception as e:
            self._fail_unlaunched(slot, batch, LAUNCH_FAILED, e)
            return
        self.completion.put(slot)

    def run(self, batch: Batch, sink: ResponseSink) -> None:
        """Execute ``batch`` in-band (the sync path on a slot of the ring); report to ``sink`` before returning.

        ``auto`` answers a batch this way when deferring it cannot gain. Each request's outcome goes
        to ``sink`` (by its handle; outputs are views valid during ``send`` only), and the slot is
        free again on return. Batches deferred before are still on the device ahead of it; the wait
        includes them. A closing ring answers the batch with ``SHUTTING_DOWN``.

        Raises:
            ClosedError: once it is closed.
        """
        self._check_open()
        t0 = time.perf_counter()
        shared = self._submitted
        try:
            # until the first deferral no other thread touches the ring (its threads start with the first
            # submit), so the batch takes the slot the ring would hand out (the one released last) without the
            # ring's lock, as SyncExecutor.run does; measured on one H200 with 4 server cores, the ring's
            # acquire and release cost 17-19 us a batch where sync's slot cost 4-6
            # (results/modes/20261127-h200-4cores-p99c)
            slot = self.ring.acquire() if shared else self.ring.unshared()
        except ShuttingDownError as e:
            for item in batch.items:
                sink.send(item.handle, None, str(e))
            return
        if not shared:
            self._count_sole_slot(t0)
            self._answer_in_band(slot, batch, sink)
            return
        took = time.perf_counter() - t0
        try:
            self._answer_in_band(slot, batch, sink)
        finally:
            t0 = time.perf_counter()
            self.ring.release(slot)
            self.stats.slot_s += took + time.perf_counter() - t0

    def _fail_unlaunched(self, slot: Slot, batch: Batch, step: Unlaunched, exc: Exception) -> None:
        """Free the slot of a batch that never reached the device at ``step`` and answer its requests."""
        error = step.message(exc)
        LOGGER.error("batch of %d requests %s: %s", len(batch.items), step.what, error)
        self.ring.release(slot)
        self.pool.dispatch(Outgoing(batch.items, None, error), self.gate.waiting)
