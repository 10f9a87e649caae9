"""Executors: the stock-equivalent sync loop and the pipelined ring of slots.

``SyncExecutor`` (the baseline): gather, launch, wait for the device, return the outputs;
one batch at a time, the caller blocked throughout, like Triton's stock backends.

``PipelinedExecutor``: ``submit`` gathers a batch into a free slot, launches it and returns at
once; several batches are in flight. A completion thread waits for slots in launch order,
copies each batch's outputs out of the slot, frees the slot, and hands the responses to a pool
of sender threads, because every Python-backend ``send()`` is a blocking round trip to the
server process (docs/LAB.md, "Toolchain facts": sent one after another they made a pipelined instance slower than
the sync one). When every slot is busy, ``submit`` waits for one (back-pressure), and when too
many batches wait for their responses the completion thread waits; both waits are counted.

``PipelinedExecutor.run`` is the sync executor's path over one slot of the ring (gather, launch,
wait, return the outputs): the ``auto`` mode answers a batch in-band through it, or defers it
through ``submit``, batch by batch (``AutoPolicy``).

``OverlapExecutor`` (mode ``overlap``): the sync mode's return path with the GPU hidden inside one
``execute()``. The batch is cut into chunks at request boundaries; chunk i+1 is gathered and
launched while the GPU runs chunk i, and chunk i's responses are built while the GPU runs chunk
i+1; all of them go back in ``execute()``'s returned list (one message per batch, no ``send()``).

The ring executors are composed of parts, not of one another: both have a ``SlotRing`` (free and
busy slots, back-pressure); ``PipelinedExecutor`` adds a ``Completion`` thread and a
``ResponsePool`` (sender threads, a bounded backlog). No executor checks request values: the mode
partitions a batch into valid and bad requests once, before anything is submitted
(``inflight.runtime.batch.partition_values``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar

import numpy as np

from inflight.errors import ClosedError, EngineError, ShuttingDownError
from inflight.runtime.batch import Batch, Item, Layout, Slot, gather, outputs_for
from inflight.runtime.runners import Runner

LOGGER = logging.getLogger(__name__)


class ResponseSink(Protocol):
    """Where responses go: the Triton response sender, or a test's collector."""

    def send(self, handle: Any, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        """Send exactly one final response (outputs, or an error) for the request ``handle``; may block."""


class Ranges(Protocol):
    """NVTX-style named ranges (a no-op object when profiling is off)."""

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A context manager that marks ``name`` on the timeline."""


class _NoRanges:
    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


#: How a field of ``ExecutorStats`` is published: ``counter`` (its increase), ``gauge`` (its value) or
#: ``histogram`` (observations the publisher drains).
MetricKind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class StatMetric:
    """Where a counter of ``ExecutorStats`` shows at Triton's metrics endpoint.

    Attributes:
        name: The metric family's name.
        kind: How it is published.
    """

    name: str
    kind: MetricKind


def _meta(doc: str, metric: str | None = None, kind: MetricKind = "counter") -> dict[str, Any]:
    """A field's metadata: ``doc`` says what it counts (its one description), ``metric`` where it is published."""
    return {"doc": doc, "metric": StatMetric(metric, kind) if metric else None}


def _stat(doc: str, metric: str | None = None, kind: MetricKind = "counter", default: float = 0) -> Any:
    """A number field of ``ExecutorStats`` (see ``_meta``)."""
    return field(default=default, metadata=_meta(doc, metric, kind))


@dataclass
class ExecutorStats:
    """Counters of one executor (cumulative; read by the metrics publisher on the execute thread).

    Each field is described once, in its metadata: ``doc`` (what it counts, also the metric's
    description) and ``metric`` (a ``StatMetric``, or None where it is only logged). ``published()``
    lists the published ones; the metrics publisher loops over them.
    """

    batches: int = _stat("Batches launched.", "inflight_batches_total")
    requests: int = _stat("Requests launched.")
    items: int = _stat("Items (rows) launched, without padding.", "inflight_items_total")
    padded_items: int = _stat("Rows launched including bucket padding.", "inflight_padded_items_total")
    launches: int = _stat(
        "Engine launches (a batch is one per sequence bucket, or more when cut; see ``Group``).",
        "inflight_launches_total",
    )
    real_tokens: int = _stat(
        "Items x their own lengths (variable-length models; items otherwise).", "inflight_real_tokens_total"
    )
    padded_tokens: int = _stat(
        "Tokens the launches computed: bucket rows x bucket length, or the token bucket of an unpadded "
        "launch; ``padded_tokens / real_tokens - 1`` is the padding waste (below 0 when unpadded launches "
        "left the requests' masked tokens out).",
        "inflight_padded_tokens_total",
    )
    unpadded_launches: int = _stat(
        "Launches run unpadded (masked tokens left out on the device).", "inflight_unpadded_launches_total"
    )
    mixed_length_batches: int = _stat(
        "Batches whose requests fell in more than one sequence bucket.", "inflight_mixed_length_batches_total"
    )
    graph_replays: int = _stat("Launches replayed from a CUDA graph.", "inflight_graph_replays_total")
    eager_launches: int = _stat(
        "Launches run eagerly (no graph: graphs off, capture failed, or the first use of a bucket captured lazily).",
        "inflight_eager_launches_total",
    )
    failed_batches: int = _stat("Batches that failed on the device.", "inflight_failed_batches_total")
    responses: int = _stat("Responses sent through ``send()`` (outputs).")
    error_responses: int = _stat("Error responses sent through ``send()``.", "inflight_error_responses_total")
    depth_launches: list[int] = field(
        default_factory=lambda: [0] * 65,
        metadata=_meta(
            "How many launches found k batches in flight (index k = depth incl. itself); published as a uniform "
            "sample of at most 8 launches per publication.",
            "inflight_launch_depth",
            "histogram",
        ),
    )
    max_depth: int = _stat("Deepest pipeline seen.")
    slot_waits: int = _stat("Times ``execute()`` found every slot busy.", "inflight_slot_waits_total")
    slot_wait_s: float = _stat(
        "Time ``execute()`` waited for a free slot.", "inflight_slot_wait_seconds_total", default=0.0
    )
    gather_s: float = _stat("Issue-path time copying request inputs into slots.", default=0.0)
    slot_s: float = _stat(
        "Execute-thread time taking and returning in-band batches' slots (the ring's ``acquire`` and "
        "``release``; the sync executor's depth count): what auto's in-band path costs over sync's.",
        default=0.0,
    )
    auto_policy_s: float = _stat(
        "auto: execute-thread time deciding each batch's path and measuring it (``AutoPolicy.decide``, ``ran``, "
        "``deferred``, the counters they set).",
        default=0.0,
    )
    launch_s: float = _stat("Issue-path time enqueueing copies and compute.", default=0.0)
    # the longest of each step of one batch (where an execute() over 10 ms spent it)
    parse_max_s: float = _stat("Longest reading of one batch's requests (``Mode.take``).", default=0.0)
    gather_max_s: float = _stat("Longest gather of one batch.", default=0.0)
    launch_max_s: float = _stat("Longest launch of one batch.", default=0.0)
    wait_max_s: float = _stat("Longest in-band wait for the device of one batch.", default=0.0)
    build_max_s: float = _stat("Longest building of one in-band batch's responses.", default=0.0)
    send_s: float = _stat(
        "Time spent in response ``send()`` calls (summed over sender threads).",
        "inflight_send_seconds_total",
        default=0.0,
    )
    send_waits: int = _stat(
        "Times a completed batch waited because ``response_backlog`` batches awaited their responses.",
        "inflight_response_backlog_waits_total",
    )
    send_wait_s: float = _stat(
        "Total time of those waits.", "inflight_response_backlog_wait_seconds_total", default=0.0
    )
    respond_latency_s: float = _stat(
        "Summed time from a batch's outputs on the host to its last response sent.",
        "inflight_respond_seconds_total",
        default=0.0,
    )
    device_wait_s: float = _stat(
        "Time the completion side waited for the device.", "inflight_device_wait_seconds_total", default=0.0
    )
    chunks: int = _stat(
        "Chunks launched (overlap mode; each is one batch in a slot, counted in ``batches`` too).",
        "inflight_chunks_total",
    )
    overlap_batches: int = _stat("Batches (``execute()`` calls) the overlap executor ran.")
    inline_wait_s: float = _stat(
        "Time the execute thread waited for the device (every batch answered in-band: sync, overlap, auto's).",
        default=0.0,
    )
    deferred_requests: int = _stat(
        "Requests of the batches auto deferred, answered through ``send()``.", "inflight_deferred_requests_total"
    )
    auto_inline: int = _stat(
        "auto: batches answered in-band, the sync mode's path, because the measured overlap bound is under "
        "``auto_bound_min`` (or not measured yet).",
        "inflight_auto_inline_batches_total",
    )
    auto_unsaturated: int = _stat(
        "auto: batches answered in-band because the period's reference window found the instance unsaturated "
        "(its busy share under ``auto_busy_min`` and its batch fill under ``auto_fill_min``; ``AutoPolicy``).",
        "inflight_auto_unsaturated_batches_total",
    )
    auto_reference: int = _stat(
        "auto: batches answered in-band in a reference window (the start of each probe period, while the "
        "overlap bound is at ``auto_bound_min`` or over; under it they count as inline; ``AutoPolicy``).",
        "inflight_auto_reference_batches_total",
    )
    auto_no_gain: int = _stat(
        "auto: batches answered in-band because the period's probe did not gain ``auto_gain_min`` by deferring "
        "(from ``auto_bound_high``: measured a loss).",
        "inflight_auto_no_gain_batches_total",
    )
    auto_deferred: int = _stat(
        "auto: batches deferred, the pipelined mode's path (in a probe window, or after a probe that gained).",
        "inflight_auto_deferred_batches_total",
    )
    auto_bound: float = _stat(
        "auto: the overlap bound measured on in-band batches (moving average; see ``AutoPolicy``).",
        "inflight_auto_overlap_bound",
        "gauge",
        default=0.0,
    )
    auto_gain: float = _stat(
        "auto: the last probe's gain, the execute thread's cycle per request in-band over deferred (0: none yet).",
        "inflight_auto_gain",
        "gauge",
        default=0.0,
    )
    auto_busy: float = _stat(
        "auto: the last reference window's busy share, the execute thread's time in ``execute()`` over its cycle "
        "(0: none yet; ``AutoPolicy``).",
        "inflight_auto_busy_share",
        "gauge",
        default=0.0,
    )
    batch_sizes: deque[int] = field(
        default_factory=lambda: deque(maxlen=100_000),
        metadata=_meta(
            "Items per executed batch, before padding (recent batches, bounded; drained by the metrics publisher, "
            "which publishes a uniform sample of at most 8 of them per publication: exact totals are "
            "inflight_batches_total and inflight_items_total).",
            "inflight_batch_size",
            "histogram",
        ),
    )

    @classmethod
    def published(cls, kind: MetricKind) -> list[tuple[str, StatMetric, str]]:
        """``(field, metric, description)`` of every field published as ``kind``."""
        return [
            (f.name, f.metadata["metric"], f.metadata["doc"])
            for f in dataclasses.fields(cls)
            if f.metadata["metric"] is not None and f.metadata["metric"].kind == kind
        ]

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy (for logs and tests)."""
        d = {k: v for k, v in self.__dict__.items() if k not in ("batch_sizes", "depth_launches")}
        d["depth_launches"] = {i: n for i, n in enumerate(self.depth_launches) if n}
        return d


@dataclass(eq=False)
class _Outgoing:
    """One batch's responses on their way out: its requests, a private copy of its outputs."""

    items: list[Item]
    outs: dict[str, np.ndarray] | None
    error: str | None
    chunks: int = 0
    t_ready: float = 0.0
    #: each request's first row in ``outs`` (request order; rows are grouped by sequence bucket)
    offsets: list[int] = field(default_factory=list)


_Job = tuple[_Outgoing, int, int]  # (batch, first request, end request)


class _Base:
    """The issue path every executor shares: gather a batch into a slot, launch it, collect its outputs.

    An executor is a context manager: leaving the block closes it, and any use after ``close()``
    raises ``ClosedError`` (as Polygraphy's runners refuse use outside their activation).
    """

    def __init__(self, runner: Runner, ranges: Ranges | None = None) -> None:
        self.runner = runner
        self.layout: Layout = runner.layout
        self.stats = ExecutorStats()
        self.ranges: Ranges = ranges or _NoRanges()
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

    def _run_in_band(self, slot: Slot, batch: Batch) -> list[dict[str, np.ndarray]]:
        """The sync path on ``slot``: gather, launch, wait for the device, return per-request output views.

        The views stay valid until the slot is gathered into again (the caller's next batch).

        Raises:
            EngineError: when the batch failed on the device.
        """
        self._prepare(slot, batch)
        self._launch(slot)
        t0 = time.perf_counter()
        with self.ranges.range("wait"):
            self.runner.wait(slot)
        waited = time.perf_counter() - t0
        with self._lock:
            self.stats.device_wait_s += waited
            self.stats.inline_wait_s += waited
            self.stats.wait_max_s = max(self.stats.wait_max_s, waited)
        return outputs_for(self.layout, slot)

    def _collect(self, slot: Slot, range_name: str) -> tuple[dict[str, np.ndarray] | None, str | None, float]:
        """Wait for the slot's batch and copy its real output rows out of the slot.

        Returns:
            The private copy of the outputs (None when the batch failed), the error message
            (None when it did not), and the seconds from the start of the wait to the copy done.
        """
        batch = slot.batch
        assert batch is not None
        t0 = time.perf_counter()
        try:
            with self.ranges.range(range_name):
                self.runner.wait(slot)
        except Exception as e:
            LOGGER.error("batch of %d requests failed on the device: %s", len(batch.items), e)
            return None, f"batch failed on the device: {e}", time.perf_counter() - t0
        # the responses get their own copy of the real rows, so the slot can be freed at once
        outs = {
            t.name: self.layout.view(slot.host_out[t.name], t, slot.rows, None).copy() for t in self.layout.spec.outputs
        }
        return outs, None, time.perf_counter() - t0


_E = TypeVar("_E", bound=_Base)


class SyncExecutor(_Base):
    """Stock-equivalent: one slot, wait for the device after each batch."""

    #: The sync mode's ring: one slot (``assembly.ring_slots`` reads it for the engine's bindings).
    SLOTS: ClassVar[int] = 1

    def __init__(self, runner: Runner, ranges: Ranges | None = None) -> None:
        super().__init__(runner, ranges)
        self.slots = runner.make_slots(self.SLOTS)

    def run(self, batch: Batch) -> list[dict[str, np.ndarray]]:
        """Execute ``batch`` and return per-request output views (valid until the next ``run``).

        Raises:
            EngineError: when the batch failed on the device.
            ClosedError: after ``close()``.
        """
        self._check_open()
        (slot,) = self.slots
        t0 = time.perf_counter()
        self._count_sole_slot(t0)
        return self._run_in_band(slot, batch)

    def in_flight(self) -> int:
        """Batches on the device between calls: none."""
        return 0

    def close(self, timeout_s: float = 10.0) -> bool:
        """Release the runner (nothing is in flight between calls); always drained."""
        if not self._closed:
            self._closed = True
            self.runner.close()
        return True


class SlotRing:
    """The slots of a ring: the free ones, the busy ones, and back-pressure.

    ``acquire`` takes the free slot released last (its buffers the warmest in the host's caches: ``auto``'s
    in-band batches, each released before the next is taken, all run on one slot as the sync mode's do),
    waiting for one when every slot is busy (counted in ``slot_waits``); ``release`` returns one;
    ``drain`` waits for the busy ones at close and marks those still busy abandoned, so that their late
    completion frees nothing.

    Args:
        slots: The slots (made once by the runner).
        stats: The executor's counters (depth and waits).
        lock: The executor's lock (the ring's condition uses it).
        ranges: NVTX ranges.
        waiting: While ``acquire`` waits, what lets the response path run (``ResponsePool.waiting``).
    """

    def __init__(
        self,
        slots: list[Slot],
        stats: ExecutorStats,
        lock: threading.Lock,
        ranges: Ranges,
        waiting: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        self.slots = slots
        self.stats = stats
        self.ranges = ranges
        self._waiting = waiting
        self._free: deque[Slot] = deque(slots)
        self._busy: set[int] = set()
        self._cond = threading.Condition(lock)
        self._closing = False
        self._abandoned: set[int] = set()

    def in_flight(self) -> int:
        """Slots currently holding a batch on the device."""
        with self._cond:
            return len(self._busy)

    def acquire(self) -> Slot:
        """A free slot, marked busy (waits for one while every slot is busy).

        Raises:
            ShuttingDownError: when the ring is closing.
        """
        with self._cond:
            if not self._free and not self._closing:
                t0 = time.perf_counter()
                self.stats.slot_waits += 1
                with self._waiting(), self.ranges.range("slot_wait"):
                    while not self._free and not self._closing:
                        self._cond.wait()
                self.stats.slot_wait_s += time.perf_counter() - t0
            if self._closing:
                raise ShuttingDownError("the model is being unloaded; retry on another instance or after reload")
            slot = self._free.pop()  # the one released last
            self._busy.add(slot.index)
            depth = len(self._busy)
            self.stats.depth_launches[min(depth, 64)] += 1
            self.stats.max_depth = max(self.stats.max_depth, depth)
            return slot

    def unshared(self) -> Slot:
        """The slot ``acquire`` would hand out, without taking it: for a ring no other thread uses yet.

        Raises:
            ShuttingDownError: when the ring is closing.
        """
        if self._closing:
            raise ShuttingDownError("the model is being unloaded; retry on another instance or after reload")
        return self._free[-1]

    def release(self, slot: Slot) -> bool:
        """Return ``slot`` to the free list; False (and nothing freed) when ``drain`` abandoned it."""
        with self._cond:
            if slot.index in self._abandoned:
                return False
            slot.batch = None
            self._busy.discard(slot.index)
            self._free.append(slot)
            self._cond.notify()
            return True

    def drain(self, deadline: float) -> list[Slot]:
        """Refuse new work, wait until ``deadline`` for the busy slots; return (and abandon) those still busy."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._busy and time.monotonic() < deadline:
                self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))
            stuck = [s for s in self.slots if s.index in self._busy]
            self._abandoned.update(s.index for s in stuck)
        return stuck


class ResponsePool:
    """Sender threads that answer completed batches through the sink, with a bounded backlog.

    Every Python-backend ``send()`` is a blocking round trip to the server process, so several
    threads send at once. At most ``backlog`` batches wait for their responses; beyond it
    ``dispatch`` waits (counted). With ``yield_to_issue`` the senders build a response only while
    the issue path is idle (see ``issuing``).

    Args:
        sink: Sends responses.
        stats: The executor's counters (sends, backlog waits).
        lock: The executor's lock.
        ranges: NVTX ranges.
        threads: Sender threads.
        backlog: Batches whose responses may wait for the senders at once.
        yield_to_issue: Hold the senders off while the issue path runs.
    """

    def __init__(
        self,
        sink: ResponseSink,
        stats: ExecutorStats,
        lock: threading.Lock,
        ranges: Ranges,
        *,
        threads: int,
        backlog: int,
        yield_to_issue: bool,
    ) -> None:
        self.sink = sink
        self.stats = stats
        self.ranges = ranges
        self._lock = lock
        self._sends: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._backlog = threading.BoundedSemaphore(backlog)
        self._yield = yield_to_issue
        self._issue_idle = threading.Event()  # clear while execute() gathers and launches
        self._issue_idle.set()
        self._issuer: int | None = None  # thread id of the issue path (set by issuing())
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

    @contextlib.contextmanager
    def issuing(self) -> Iterator[None]:
        """Mark the issue path busy: sender threads hold off building responses meanwhile.

        Sends already in their round trip carry on (that part does not hold the GIL); the senders
        resume when the block ends or the issue path waits (``waiting``), so they can never be
        starved into a deadlock.
        """
        self._issuer = threading.get_ident()
        if not self._yield:
            yield
            return
        self._issue_idle.clear()
        try:
            yield
        finally:
            self._issue_idle.set()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The issue path waits (for a slot, for the backlog): the senders may run meanwhile."""
        busy = not self._issue_idle.is_set()
        self._issue_idle.set()
        try:
            yield
        finally:
            if busy:
                self._issue_idle.clear()

    def dispatch(self, out: _Outgoing) -> None:
        """Queue a batch's responses as one job per sender thread (fewer wake-ups than one job each)."""
        if not self._backlog.acquire(blocking=False):
            t0 = time.perf_counter()
            with self._lock:
                self.stats.send_waits += 1
            # the senders free the backlog: if the issue path itself waits here (a batch that
            # failed to launch), it must let them run, or both would wait for each other
            issuer = threading.get_ident() == self._issuer
            with self.waiting() if issuer else contextlib.nullcontext(), self.ranges.range("backlog_wait"):
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
            idle = self._issue_idle
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

    def open_gate(self) -> None:
        """Nothing is issued any more (the executor closes): the senders must not wait for the issue path."""
        self._issue_idle.set()

    def stop(self, deadline: float) -> None:
        """Send what is queued, then stop the threads (waiting until ``deadline``, 5 s at least)."""
        self.open_gate()
        with self._start_lock:
            if not self._started:  # nothing was ever dispatched: no thread to stop, none may start now
                self._started = True
                return
        # sentinels queue behind every response already dispatched: those are sent first
        for _ in self.threads:
            self._sends.put(None)
        for t in self.threads:
            t.join(timeout=max(5.0, deadline - time.monotonic()))


class Completion:
    """The completion thread: waits for launched slots in launch order and hands their responses on.

    For each slot it waits for the device, copies the outputs out of the slot, frees the slot
    (unless ``SlotRing.drain`` abandoned it: its requests were failed already) and dispatches the
    responses to the response pool.

    Args:
        collect: Waits for a slot and copies its outputs (``_Base._collect``).
        ring: Where the slots go back.
        pool: Who answers.
        stats: The executor's counters.
        lock: The executor's lock.
    """

    def __init__(
        self,
        collect: Callable[[Slot, str], tuple[dict[str, np.ndarray] | None, str | None, float]],
        ring: SlotRing,
        pool: ResponsePool,
        stats: ExecutorStats,
        lock: threading.Lock,
    ) -> None:
        self._collect = collect
        self._ring = ring
        self._pool = pool
        self._stats = stats
        self._lock = lock
        self._queue: queue.SimpleQueue[Slot | None] = queue.SimpleQueue()
        # started by the first slot handed over (see ResponsePool: in-band batches never need it)
        self.thread = threading.Thread(target=self._loop, name="inflight-completion", daemon=True)

    def put(self, slot: Slot) -> None:
        """Hand over a launched slot (the first one starts the thread; only the issue path calls this)."""
        if self.thread.ident is None:
            self.thread.start()
        self._queue.put(slot)

    def _loop(self) -> None:
        while True:
            slot = self._queue.get()
            if slot is None:
                return
            batch = slot.batch
            assert batch is not None
            outs, error, waited = self._collect(slot, "complete")
            item_rows = list(slot.item_rows) if error is None else []
            with self._lock:
                if error is None:
                    self._stats.device_wait_s += waited
                else:
                    self._stats.failed_batches += 1
            if self._ring.release(slot):
                self._pool.dispatch(_Outgoing(batch.items, outs, error, offsets=item_rows))

    def stop(self, deadline: float) -> None:
        """Stop after the slots handed over (waiting until ``deadline``, 1 s at least)."""
        if self.thread.ident is None:  # never started: no slot was handed over
            return
        self._queue.put(None)
        self.thread.join(timeout=max(1.0, deadline - time.monotonic()))


class PipelinedExecutor(_Base):
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
        self.pool = ResponsePool(
            sink,
            self.stats,
            self._lock,
            self.ranges,
            threads=response_threads,
            backlog=response_backlog,
            yield_to_issue=yield_to_issue,
        )
        self.ring = SlotRing(runner.make_slots(slots), self.stats, self._lock, self.ranges, self.pool.waiting)
        self.slots = self.ring.slots
        self.completion = Completion(self._collect, self.ring, self.pool, self.stats, self._lock)
        self._submitted = False  # set by the first ``submit`` (only the execute thread reads and writes it)

    def issuing(self) -> contextlib.AbstractContextManager[None]:
        """Wrap each ``execute()`` in it: the senders hold off meanwhile (``ResponsePool.issuing``)."""
        return self.pool.issuing()

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
        self.pool.open_gate()
        stuck = self.ring.drain(deadline)
        if stuck:
            LOGGER.error(
                "%d batch(es) still in flight after %.1f s; failing their requests explicitly", len(stuck), timeout_s
            )
            for s in stuck:
                if s.batch is not None:
                    for item in s.batch.items:
                        with contextlib.suppress(Exception):
                            self.pool.sink.send(item.handle, None, "the model was unloaded before this batch completed")
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
            self._fail_unlaunched(slot, batch, "could not be gathered", f"batch failed before launch: {e}")
            return
        try:
            self._launch(slot)
        except Exception as e:
            self._fail_unlaunched(slot, batch, "failed to launch", f"batch failed to launch on the device: {e}")
            return
        self.completion.put(slot)

    def run(self, batch: Batch) -> list[dict[str, np.ndarray]]:
        """Execute ``batch`` in-band, the sync executor's path on a slot of the ring; return its output views.

        ``auto`` answers a batch this way when deferring it cannot gain. The slot is free again on
        return; its output views stay valid until the caller's next batch (only the execute thread
        gathers into slots, so they outlive the ``execute()`` that returns them). Batches deferred
        before are still on the device ahead of it; the wait includes them.

        Raises:
            EngineError: when the batch failed on the device.
            ShuttingDownError: when the executor is closing; ``ClosedError`` once it is closed.
        """
        self._check_open()
        t0 = time.perf_counter()
        if not self._submitted:
            # nothing was ever deferred: no other thread touches the ring (its threads start with the first
            # submit), so the batch takes the slot the ring would hand out (the one released last) without the
            # ring's lock, as SyncExecutor.run does; measured on one H200 with 4 server cores, the ring's
            # acquire and release cost 17-19 us a batch where sync's slot cost 4-6
            # (results/modes/20261127-h200-4cores-p99c)
            slot = self.ring.unshared()
            self._count_sole_slot(t0)
            return self._run_in_band(slot, batch)
        slot = self.ring.acquire()
        took = time.perf_counter() - t0
        try:
            return self._run_in_band(slot, batch)
        finally:
            t0 = time.perf_counter()
            self.ring.release(slot)
            self.stats.slot_s += took + time.perf_counter() - t0

    def _fail_unlaunched(self, slot: Slot, batch: Batch, what: str, error: str) -> None:
        """Free the slot of a batch that never reached the device and answer its requests with ``error``."""
        LOGGER.error("batch of %d requests %s: %s", len(batch.items), what, error)
        self.ring.release(slot)
        self.pool.dispatch(_Outgoing(batch.items, None, error))


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


@dataclass
class _Tally:
    """What one window of ``AutoPolicy`` measured (its first quarter left out)."""

    cycle_s: float = 0.0
    execute_s: float = 0.0  # the part of cycle_s inside execute() (the rest: the gaps between them)
    requests: int = 0
    batches: int = 0
    fill: float = 0.0  # summed over the batches (the reference window's in-band ones)

    def add(self, cycle_s: float, execute_s: float, requests: int, fill: float) -> None:
        self.cycle_s += cycle_s
        self.execute_s += execute_s
        self.requests += requests
        self.batches += 1
        self.fill += fill

    def busy(self) -> float:
        """The share of the measured cycles spent inside ``execute()``."""
        return self.execute_s / self.cycle_s if self.cycle_s > 0 else 0.0

    def per_request_s(self) -> float:
        return self.cycle_s / self.requests


@dataclass
class AutoPolicy:
    """How ``auto`` answers each batch: in-band, the sync mode's path, or deferred, the pipelined mode's.

    Two measurements decide, because deferring has a gain and a cost:

    * **The overlap bound** (the gain's ceiling). The execute thread's cycle per batch is the gap
      between two ``execute()`` calls (the Python stub receives the next batch on it, or waits for
      one) plus ``execute()`` itself; deferring takes the device wait out of it, so
      ``cycle / (cycle - wait)`` is the most a deferral could add to the instance's rate. Every
      in-band batch measures it (moving average). Under ``bound_min`` (an idle instance's long
      gaps, or a device wait small next to the host's work) every batch is answered in-band.
    * **The measured gain** (the cost included). A deferred batch's responses go one by one
      through the response sender (a message to the server each, and sender threads that take CPU
      from every instance on the server's cores), where an in-band batch's go back in one. On
      scarce server cores that cost can exceed the device wait a deferral hides. On one H200 with
      6 server cores, bert-tiny, the bound-only rule deferred 23,762 of 41,838 batches in an
      overload window (bound 1.29), the server spent 347 us of CPU per request under ``auto`` at
      17,000 req/s against 265 under sync at 20,000, and ``<model>_inflight`` held 15,500 req/s
      at the SLO where sync held 26,000 (``results/two-gpu/20261126-h200x2-c6``); how much of
      that deferring cost is not settled (a later round that deferred nothing also lost:
      ``results/modes/20261126-h200-6cores-probe``). So the policy measures the gain:
      wall-clock time is cut into periods of ``period_s``; each starts with a **reference
      window** of ``window_s`` answered in-band and, when the bound allows, a **probe window**
      of ``window_s`` deferred; the execute thread's cycle per request in each (after the first
      quarter, where the previous window's batches drain) gives ``gain = reference / probe``. The
      rest of the period is deferred only when ``gain >= gain_min`` (``gain_min`` 0: whenever the
      bound allows). Without enough batches in either window (``min_batches``; from ``bound_high``
      one probe batch will do) it stays in-band.
      Below saturation the cycle per request is the arrival gap, so the gain is the ratio of two
      windows' arrival counts: on the CPU host at 400 req/s to one instance it passed 1.05 in
      about a quarter of the periods; ``gain_min`` 1.15 keeps that noise from deferring.
      The same arrival-bound measure hides a gain until the in-band path is overloaded by more than
      ``gain_min``: one bert-small instance (bound 1.90) whose pipelined path held >= 4,000 req/s
      measured gains of about 1.11 and held sync's 2,469 (``results/modes/20261126-h200-regime-busy``).
      So from ``bound_high`` (a device wait of a third of the cycle or more; every loss measured so
      far came at bounds of 1.29 or less) the burden of proof turns: the rest of the period is
      deferred unless the probe measured a **loss** (``gain < 1 / gain_min``). A reference window
      is in-band, so above the in-band path's capacity it builds a queue: bert-small deferred from
      the high bound held 2,906 req/s at p99 <= 50 ms where pipelined held >= 4,000, p99 55.8 ms at
      3,125 with p50 9.5 (``results/modes/20261126-h200-regime-high``). So each such deferring
      period skips the windows of the next 1, 2, 4 ... ``max_skip`` periods (deferred throughout),
      and at least one period in ``max_skip + 1`` probes again (0.5 s in 330 with the defaults:
      under the 1% of the time a p99 sees); any other decision starts the count again. While it
      skips, nothing is measured: a load that falls keeps deferring until the next probe (at most
      ``max_skip`` periods), and instances whose counts differ probe in different periods (the
      windows stay on the host's clock). For the same reason, from the high bound (no loss measured
      by the last probe) a reference window ends as soon as it has measured a saturated instance
      (``min_batches`` after its first quarter), its probe window following at once; and an
      unsaturated period whose load rises defers its rest once ``window_s`` of in-band batches shows
      a saturated instance (unmeasured: the next period's probe judges it). Both were seen on one
      bert-small instance: a window at 3,500 req/s after one at 1,000 stayed in-band for the rest of
      a period judged at the lower load, p50 449 ms where pipelined's was 9.4
      (``results/modes/20261126-h200-bert_small-skip``). Under ``bound_high`` a probe that measured a
      loss quiets the next 1, 2, 4 ... ``max_skip`` periods (in-band, no window): there deferring can
      gain little (at most the bound), and each losing probe costs its window's batches and the queue
      they leave; one H200 with 4 server cores measured bert-tiny's default deferring at 0.28x the
      in-band rate in a probe at overload (bound 1.19), repeated every period
      (``results/modes/20261126-h200-4cores-pooled``). From the high bound a loss keeps the windows
      in every period, so a load at which deferring gains again is found within one. A probe also costs
      latency where deferring is slower (that CPU host: p99 33 ms against sync's 12 with probes
      in an eighth of the time), so an instance probes only when saturated, by its reference
      window: the execute thread spent at least ``busy_min`` of its cycle inside ``execute()``
      (idle, it waits between batches for requests to arrive), or the batches filled at least
      ``fill_min`` of the largest batch on average (Triton's dynamic batcher fills them from a
      queue; idle, they hold a request or two). Fill alone misses a saturated instance of a
      GPU-heavy model: one bert-small instance at its capacity fills 0.32 (13 requests x 50
      items of 2,048) and never probed (``results/modes/20261126-h200-regime-heads``).

    The periods follow the host's clock (``time.time``), so every instance of every ``auto``
    model on the server probes in the same windows: a probe measures what deferring costs when
    every instance defers, not one instance's gain at the others' expense. Below saturation the
    cycle per request is the arrival gap in both windows, the gain about 1, and the batches
    in-band: the sync mode's latency.

    Attributes:
        bound_min: The overlap bound from which deferring is considered (1: as soon as measured).
        bound_high: The overlap bound from which a saturated instance defers unless its probe
            measured a loss (below it, only when the probe measured a gain).
        gain_min: The measured gain from which the rest of a period is deferred (0: no probe, and
            no saturation, needed: deferred whenever the bound allows).
        period_s: Length of a period (reference window, probe window, then the decision).
        window_s: Length of the reference window and of the probe window.
        min_batches: Batches each window must measure for a decision to defer (4: a model whose
            full batch takes 90 ms still gives that many in the measured 0.375 s of a window).
        fill_min: Mean batch fill (items over the largest batch) of the reference window from
            which the instance counts as saturated and probes.
        busy_min: Share of the reference window's cycles spent inside ``execute()`` from which
            the instance counts as saturated and probes (either this or ``fill_min`` will do).
        max_skip: Most periods a high-bound deferral skips the windows of, and a loss under the high
            bound quiets (see above).
        alpha: Weight of a new measurement in the bound's moving average.
        clock: Wall-clock seconds (the same on every process of the host).
        bound: The measured overlap bound (moving average); None until an in-band batch measured it.
        gain: The last period's measured gain; None until one was measured.
        busy: The last reference window's busy share; None until one was judged.
        gap_s: The gap before the current ``execute()`` (``between``).
    """

    bound_min: float = 1.4
    bound_high: float = 1.5
    gain_min: float = 1.15
    period_s: float = 10.0
    window_s: float = 0.5
    min_batches: int = 4
    fill_min: float = 0.5
    busy_min: float = 0.7
    max_skip: int = 32
    alpha: float = 0.1
    clock: Callable[[], float] = time.time
    bound: float | None = None
    gain: float | None = None
    busy: float | None = None
    gap_s: float = 0.0
    _period: int = -1
    _window: str = ""
    _counts: bool = False
    _tallies: dict[str, _Tally] = field(default_factory=dict)
    _defer_rest: bool | None = None
    _saturated: bool | None = None
    _streak: int = 0
    _skip_until: float = -math.inf  # the first period that probes again after a skip
    _quiet_streak: int = 0
    _quiet_until: float = -math.inf  # under bound_high, the first period that probes again after a measured loss
    _at: float = 0.0  # where in its period the clock was at the last decision
    _probe_at: float = 0.0  # where in the period the probe window starts (window_s, or earlier from the high bound)
    _watch: _Tally = field(default_factory=_Tally)  # an unsaturated period's in-band batches since _watch_from
    _watch_from: float = 0.0

    def __post_init__(self) -> None:
        if self.period_s < 2 * self.window_s or self.window_s <= 0:
            raise ValueError(
                f"period_s={self.period_s}, window_s={self.window_s}: a period holds two windows "
                "(period >= 2 x window > 0)"
            )

    def between(self, gap_s: float) -> None:
        """The execute thread spent ``gap_s`` between the previous ``execute()``'s return and this one."""
        self.gap_s = max(0.0, gap_s)

    def _where(self) -> str:
        """Which window the clock is in (``reference``, ``probe``, ``rest``, ``skip``); a new period resets the sums."""
        t = self.clock()
        period = int(t // self.period_s)
        at = t - period * self.period_s
        self._at = at
        if period != self._period:
            if period < self._period:  # the clock stepped back: forget the skips it would stretch
                self._skip_until, self._streak = -math.inf, 0
                self._quiet_until, self._quiet_streak = -math.inf, 0
            self._period = period
            self._tallies = {"reference": _Tally(), "probe": _Tally()}
            self._defer_rest = None
            self._saturated = None
            self._probe_at = self.window_s
            self._watch = _Tally()
        if period < self._skip_until:
            self._counts = False
            return "skip"
        window = "reference" if at < self._probe_at else "probe" if at < self._probe_at + self.window_s else "rest"
        start = 0.0 if window == "reference" else self._probe_at
        self._counts = window != "rest" and at - start >= self.window_s / 4
        return window

    def _saturated_by(self, tally: _Tally) -> bool:
        """Whether a window's in-band batches show a saturated instance (``busy_min`` or ``fill_min``)."""
        full = tally.fill >= self.fill_min * tally.batches
        busy = self.busy_min < 1.0 and tally.busy() >= self.busy_min  # busy_min 1: by fill alone
        return tally.batches >= self.min_batches and (full or busy)

    def _is_high(self) -> bool:
        """Whether the measured bound reached ``bound_high``."""
        return self.bound is not None and self.bound >= self.bound_high

    def _loss_under(self) -> float:
        """The gain under which a probe measured a loss: 1 / ``gain_min`` (with ``gain_min`` under 1: ``gain_min``)."""
        return min(self.gain_min, 1.0 / self.gain_min)

    def _high_and_no_loss(self) -> bool:
        """From ``bound_high``, with no loss measured by the last probe (the rule that defers by default)."""
        if not self._is_high() or self.gain_min <= 0:
            return False
        return self.gain is None or self.gain >= self._loss_under()

    def inline(self) -> bool:
        """Whether the next batch takes the fast in-band path (``decide``'s ``inline``): bound under ``bound_min``.

        No window can defer under ``bound_min`` (a skip follows a deferral from ``bound_high``, and a skipped
        period measures no bound), so the clock's windows are not read and ``ran`` counts nothing; a bound that
        rises to ``bound_min`` mid-period finds that period's reference window uncounted (unsaturated: in-band
        until the next period's window measures it).
        """
        if self.bound is not None and self.bound < self.bound_min:
            self._window = ""
            return True
        return False

    def decide(self) -> tuple[bool, str]:
        """Whether to defer the next batch.

        Returns:
            The decision and its reason: in-band ``reference`` (the period's reference window),
            ``unmeasured``, ``inline`` (bound under ``bound_min``, in any window: the fast path, which
            reads no clock and counts nothing), ``unsaturated`` (the reference
            window under ``busy_min`` and ``fill_min``) or ``no_gain`` (the probe did not gain
            ``gain_min``, or from ``bound_high`` measured a loss, or measured too few batches; or a
            period quieted by a loss under ``bound_high``);
            deferred ``probe`` or ``deferred`` (also every batch of a skipped period).
        """
        if self.inline():
            return False, "inline"
        self._window = self._where()
        if self._window == "skip":
            return True, "deferred"
        if self._period < self._quiet_until and not self._is_high():
            return False, "no_gain"  # a probe under bound_high measured a loss: in-band, no window, for a while
        if self._window == "reference":
            return False, "reference"
        if self.bound is None:
            return False, "unmeasured"
        if self.gain_min <= 0:
            return True, "deferred"
        if self._saturated is None:
            ref = self._tallies["reference"]
            self.busy = ref.busy()
            self._saturated = self._saturated_by(ref)
            if not self._saturated:
                self._streak = 0
        if not self._saturated:
            return False, "unsaturated"
        if self._window == "probe" and self._defer_rest is None:
            return True, "probe"
        if self._defer_rest is None:
            self._defer_rest = self._judge()
        return (True, "deferred") if self._defer_rest else (False, "no_gain")

    def _judge(self) -> bool:
        """Whether the rest of the period is deferred: a gain of ``gain_min`` under ``bound_high``, no loss from it."""
        high = self._is_high()
        ref, probe = self._tallies["reference"], self._tallies["probe"]
        measured = ref.requests and probe.requests and probe.cycle_s
        # the probe's batches a decision needs: min_batches below the high bound; from it one will do (a
        # deferred path too slow to finish min_batches in the window is the loss the rule looks for)
        enough = ref.batches >= self.min_batches and probe.batches >= (1 if high else self.min_batches)
        if not enough or not measured:
            defer = False
        else:
            self.gain = ref.per_request_s() / probe.per_request_s()
            defer = self.gain >= (self._loss_under() if high else self.gain_min)
        # from the high bound, a deferring period skips the windows of the next ones: 1, 2, 4 ... max_skip;
        # the count goes on only from the period its last skip ended at (not across idle or in-band ones)
        follows = self._period == self._skip_until
        self._streak = min(self._streak + 1 if follows else 1, 64) if defer and high else 0
        if self._streak:
            self._skip_until = self._period + 1 + min(2 ** (self._streak - 1), self.max_skip)
        # under the high bound, a measured loss quiets the next 1, 2, 4 ... max_skip periods (in-band, no window):
        # each probe that loses costs its window's batches and the queue they leave behind
        lost = not high and self.gain is not None and bool(enough and measured) and self.gain < self._loss_under()
        follows = self._period == self._quiet_until
        self._quiet_streak = min(self._quiet_streak + 1 if follows else 1, 64) if lost else 0
        if self._quiet_streak:
            self._quiet_until = self._period + 1 + min(2 ** (self._quiet_streak - 1), self.max_skip)
        return defer

    def _count(self, window: str, cycle_s: float, execute_s: float, requests: int, fill: float) -> None:
        if self._counts and self._window == window and requests > 0:
            self._tallies[window].add(cycle_s, execute_s, requests, fill)

    def ran(self, execute_s: float, wait_s: float, requests: int = 1, fill: float = 1.0) -> None:
        """An in-band ``execute()`` of ``requests`` took ``execute_s``, ``wait_s`` of it waiting for the device.

        ``fill`` is the batch's items over the largest batch the instance takes.
        """
        cycle = self.gap_s + execute_s
        if cycle <= 0:
            return
        sample = cycle / max(cycle - min(wait_s, cycle), 1e-9)
        self.bound = sample if self.bound is None else self.bound + self.alpha * (sample - self.bound)
        if not self._window:  # decided on the fast in-band path (or not decided): no window to count in
            return
        self._count("reference", cycle, execute_s, requests, fill)
        if self._window == "skip" or not self._high_and_no_loss():
            return
        w = self.window_s
        if self._window == "reference":
            # from the high bound an in-band reference window above the in-band capacity builds a queue: it
            # ends once it has measured a saturated instance (min_batches after its first quarter)
            if self._probe_at == w and self._counts and self._saturated_by(self._tallies["reference"]):
                self._probe_at = max(self._at, w / 4)
        elif self._saturated is False and requests > 0:
            # an unsaturated period whose load rose: the rest is deferred once window_s of in-band batches
            # shows a saturated instance (the next period's probe measures the gain)
            if self._watch.batches == 0:
                self._watch_from = self._at
            self._watch.add(cycle, execute_s, requests, fill)
            if self._at - self._watch_from >= w:
                if self._saturated_by(self._watch):
                    self._saturated, self._defer_rest, self.busy = True, True, self._watch.busy()
                self._watch = _Tally()

    def deferred(self, execute_s: float, requests: int) -> None:
        """A deferring ``execute()`` of ``requests`` returned after ``execute_s``."""
        self._count("probe", self.gap_s + execute_s, execute_s, requests, 0.0)


#: Builds the response object of one request from its outputs, or from an error message.
Respond = Callable[[Mapping[str, np.ndarray] | None, str | None], Any]


class OverlapExecutor(_Base):
    """Chunks of one batch overlapped on the GPU, answered in ``execute()``'s returned list.

    ``run`` cuts the batch into chunks (``chunk_bounds``); each chunk takes a slot of a
    ``SlotRing``, is gathered and launched, and the previous chunk is waited for, its outputs
    copied out of the slot (the slot is free again at once) and its responses built while the GPU
    runs the newer chunk. Responses are returned, so the Python backend ships them in one message
    per batch, the sync mode's cost per request. Nothing is in flight between two ``run`` calls,
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

    def run(self, batch: Batch, respond: Respond) -> list[Any]:
        """Execute ``batch``; return each request's response object, in order.

        Never raises for a chunk's failure: the requests of a chunk that failed get
        ``respond(None, message)``, and the other chunks carry on. The batch's values were checked
        by ``partition_values`` before.

        Raises:
            ClosedError: after ``close()``.
        """
        self._check_open()
        items = batch.items
        out: list[Any] = [None] * len(items)
        position = {id(it): k for k, it in enumerate(items)}
        bounds = chunk_bounds([it.count for it in items], self.chunk_items, self.max_chunks)
        with self._lock:
            self.stats.overlap_batches += 1
        pending: deque[Slot] = deque()
        for ci, (lo, hi) in enumerate(bounds):
            last = ci == len(bounds) - 1
            slot = self._start(items[lo:hi], out, position, respond)
            if slot is not None:
                pending.append(slot)
            while len(pending) > (0 if last else 1):
                self._finish(pending.popleft(), out, position, respond)
        return out

    def _start(self, chunk: list[Item], out: list[Any], position: Mapping[int, int], respond: Respond) -> Slot | None:
        """Gather and launch one chunk; answer its requests in ``out`` when that fails."""
        try:
            slot = self.ring.acquire()
        except ShuttingDownError as e:
            for it in chunk:
                out[position[id(it)]] = respond(None, str(e))
            return None
        for step, what, error in (
            (self._prepare, "could not be gathered", "batch failed before launch"),
            (lambda s, _: self._launch(s), "failed to launch", "batch failed to launch on the device"),
        ):
            try:
                step(slot, Batch(chunk))
            except Exception as e:
                LOGGER.error("chunk of %d requests %s: %s", len(chunk), what, e)
                self.ring.release(slot)
                for it in chunk:
                    out[position[id(it)]] = respond(None, f"{error}: {e}")
                return None
        with self._lock:
            self.stats.chunks += 1
        return slot

    def _finish(self, slot: Slot, out: list[Any], position: Mapping[int, int], respond: Respond) -> None:
        """Wait for one chunk, copy its outputs out, free its slot, build its responses into ``out``."""
        batch = slot.batch
        assert batch is not None
        outs, error, waited = self._collect(slot, "wait")
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
                    out[position[id(it)]] = respond(None, error)
                else:
                    out[position[id(it)]] = respond({name: v[r : r + it.count] for name, v in outs.items()}, None)


__all__ = [
    "AutoPolicy",
    "Completion",
    "EngineError",
    "ExecutorStats",
    "OverlapExecutor",
    "PipelinedExecutor",
    "ResponsePool",
    "ResponseSink",
    "SlotRing",
    "SyncExecutor",
    "chunk_bounds",
]
