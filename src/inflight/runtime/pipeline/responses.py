"""``ResponsePool``: the sender threads that answer completed batches through the sink, with a bounded backlog."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inflight.runtime.batch import Item
from inflight.runtime.pipeline.contract import LOGGER, Ranges, ResponseSink
from inflight.runtime.pipeline.gate import IssueGate
from inflight.runtime.pipeline.stats import ExecutorStats


@dataclass(eq=False)
class Outgoing:
    """One batch's responses on their way out: its requests, a private copy of its outputs."""

    items: list[Item]
    outs: dict[str, np.ndarray] | None
    error: str | None
    chunks: int = 0
    t_ready: float = 0.0
    #: each request's first row in ``outs`` (request order; rows are grouped by sequence bucket)
    offsets: list[int] = field(default_factory=list)


Job = tuple[Outgoing, int, int]  # (batch, first request, end request)


class ResponsePool:
    """Sender threads that answer completed batches through the sink, with a bounded backlog.

    Every Python-backend ``send()`` is a blocking round trip to the server process, so several
    threads send at once. At most ``backlog`` batches wait for their responses; beyond it
    ``dispatch`` waits (counted). The senders build a response only while ``gate`` is open (the
    issue path idle or waiting: ``IssueGate``).

    Args:
        sink: Sends responses.
        stats: The executor's counters (sends, backlog waits).
        lock: The executor's lock.
        ranges: NVTX ranges.
        gate: Open while the senders may build responses (owned by the executor).
        threads: Sender threads.
        backlog: Batches whose responses may wait for the senders at once.
    """

    def __init__(
        self,
        sink: ResponseSink,
        stats: ExecutorStats,
        lock: threading.Lock,
        ranges: Ranges,
        gate: IssueGate,
        *,
        threads: int,
        backlog: int,
    ) -> None:
        self.sink = sink
        self.stats = stats
        self.ranges = ranges
        self._lock = lock
        self._sends: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._backlog = threading.BoundedSemaphore(backlog)
        self._gate = gate
        # started by the first batch submitted: an auto instance that answers every batch in-band never
        # starts them, and holds no more threads than a sync one
        self.threads = [
            threading.Thread(target=self._send_loop, name=f"inflight-send-{i}", daemon=True) for i in range(threads)
        ]
        self._started = False
        self._start_lock = threading.Lock()

    def start(self) -> None:
        """Start the sender threads, once (``PipelinedExecutor.submit``, before anything is dispatched)."""
        if self._started:
            return
        with self._start_lock:
            if not self._started:
                for t in self.threads:
                    t.start()
                self._started = True

    def dispatch(
        self,
        out: Outgoing,
        waiting: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        """Queue a batch's responses as one job per sender thread (fewer wake-ups than one job each).

        Args:
            out: The batch's responses.
            waiting: Wraps a wait for room in the backlog: the issue path passes its ``IssueGate.waiting``
                (the senders free the backlog, so they must run while it waits); the completion thread none.
        """
        if not self._backlog.acquire(blocking=False):
            t0 = time.perf_counter()
            with self._lock:
                self.stats.send_waits += 1
            # the senders free the backlog: if the issue path itself waits here (a batch that
            # failed to launch), it must let them run, or both would wait for each other
            with waiting(), self.ranges.range("backlog_wait"):
                self._backlog.acquire()
            with self._lock:
                self.stats.send_wait_s += time.perf_counter() - t0
        n = len(out.items)
        per = -(-n // len(self.threads))
        bounds = [(i, min(n, i + per)) for i in range(0, n, per)]
        out.chunks = len(bounds)
        if out.outs is not None and not out.offsets:
            out.offsets = np.cumsum([0] + [it.count for it in out.items[:-1]]).tolist()
        out.t_ready = time.perf_counter()
        for lo, hi in bounds:
            self._sends.put((out, lo, hi))

    def _send_loop(self) -> None:
        while True:
            job = self._sends.get()
            if job is None:
                return
            out, lo, hi = job
            t0 = time.perf_counter()
            sent = 0
            outs = out.outs
            offsets = out.offsets
            idle = self._gate.idle
            with self.ranges.range("respond"):
                for k in range(lo, hi):
                    item = out.items[k]
                    if not idle.is_set():
                        idle.wait()
                    try:
                        if outs is None:
                            self.sink.send(item.handle, None, out.error)
                        else:
                            a = offsets[k]
                            b = a + item.count
                            self.sink.send(item.handle, {name: v[a:b] for name, v in outs.items()}, None)
                        sent += 1
                    except Exception as e:  # the server refused it: log, and carry on with the others
                        LOGGER.error("sending a response failed: %s: %s", type(e).__name__, e)
            t1 = time.perf_counter()
            with self._lock:
                self.stats.send_s += t1 - t0
                if outs is None:
                    self.stats.error_responses += sent
                else:
                    self.stats.responses += sent
                out.chunks -= 1
                last = out.chunks == 0
                if last:
                    self.stats.respond_latency_s += t1 - out.t_ready
            if last:
                self._backlog.release()

    def stop(self, deadline: float) -> None:
        """Send what is queued, then stop the threads (waiting until ``deadline``, 5 s at least)."""
        self._gate.open()
        with self._start_lock:
            if not self._started:  # nothing was ever dispatched: no thread to stop, none may start now
                self._started = True
                return
        # sentinels queue behind every response already dispatched: those are sent first
        for _ in self.threads:
            self._sends.put(None)
        for t in self.threads:
            t.join(timeout=max(5.0, deadline - time.monotonic()))
