"""How an instance answers a batch: its mode, a strategy chosen once when the instance loads.

``inflight.runtime.assembly.build_mode`` builds one of these from the ``mode`` parameter, as
PyTriton picks its responses handler once (``pytriton/proxy/model.py``); ``InflightModel`` then
hands every ``execute()`` to it and never asks which it is. Each mode has the same three parts:

* ``execute(requests)``: read every request and partition the valid from the bad once, before
  anything is submitted (``Mode.take``), answer the bad ones through the mode's own rejection path,
  run the rest;
* ``fail(requests, message)``: the mode's answer when ``execute()`` raised (the last line of defence);
* ``close(timeout_s)``: drain and release the executor (the mode is a context manager too).

The modes:

* ``SyncMode``: the batch's responses are returned after waiting for the device (the
  stock-equivalent baseline);
* ``PipelinedMode``: ``None`` is returned as soon as the batch is enqueued; each request later gets
  exactly one response (``TRITONSERVER_RESPONSE_COMPLETE_FINAL``) through its response sender, from
  the executor's sender threads. The default transaction policy is kept, so plain HTTP and gRPC
  clients work (decoupled models would be refused by them);
* ``OverlapMode``: the batch runs in chunks overlapped on the GPU and every response is returned
  (the sync mode's one message per batch);
* ``AutoMode``: each batch either way of the first two, over one ``PipelinedExecutor``: in-band
  (``SyncMode``'s path, ``PipelinedExecutor.run``) or deferred (``PipelinedMode``'s path,
  ``PipelinedExecutor.submit``), as its ``AutoPolicy`` decides from the overlap bound it measures.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from inflight.errors import ShuttingDownError, ValidationError
from inflight.models.spec import ModelSpec
from inflight.runtime.batch import Batch, Item, partition_values
from inflight.runtime.pipeline import (
    AutoPolicy,
    Counters,
    ExecutorStats,
    OverlapExecutor,
    PipelinedExecutor,
    Ranges,
    Returned,
    SyncExecutor,
    failed_on_device,
)

LOGGER = logging.getLogger(__name__)

#: Seconds between two log lines about rejected requests of one reason (each line is a round trip).
REJECT_LOG_INTERVAL_S = 10.0

#: Reads one request: its input arrays, its items and its sequence length (None: fixed shapes).
Read = Callable[[Any], "tuple[dict[str, np.ndarray], int, int | None]"]


class TritonSink:
    """Builds Triton responses and sends one final response per request through its ``InferenceResponseSender``."""

    def __init__(self, pb_utils: Any) -> None:
        self.pb = pb_utils
        self.final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._lock = threading.Lock()
        self.build_s = 0.0
        self.call_s = 0.0

    def response(self, outputs: Mapping[str, np.ndarray] | None, error: str | None, code: Any = None) -> Any:
        """Build an ``InferenceResponse`` with outputs or an error."""
        pb = self.pb
        if error is not None:
            err = pb.TritonError(error) if code is None else pb.TritonError(error, code)
            return pb.InferenceResponse(output_tensors=[], error=err)
        assert outputs is not None
        return pb.InferenceResponse(output_tensors=[pb.Tensor(name, a) for name, a in outputs.items()])

    def send(self, handle: Any, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        """Send the final response for the request whose sender is ``handle``.

        The time spent building the response object and inside ``send()`` are added to
        ``build_s`` and ``call_s`` (diagnostics in the finalize log).
        """
        t0 = time.perf_counter()
        response = self.response(outputs, error)
        t1 = time.perf_counter()
        handle.send(response, flags=self.final)
        t2 = time.perf_counter()
        with self._lock:
            self.build_s += t1 - t0
            self.call_s += t2 - t1


class Rejections:
    """Requests answered with ``INVALID_ARG``: counted by reason, logged now and then (execute thread only).

    Triton counts a request its backend answers with an error as a success (``/stats``,
    ``nv_inference_request_success``), so the backend keeps its own count, published as
    ``inflight_rejected_requests_total{reason=...}`` and logged at most every
    ``REJECT_LOG_INTERVAL_S`` per reason.

    Args:
        sink: Builds the error responses.
        model_name: For the log.
    """

    def __init__(self, sink: TritonSink, model_name: str) -> None:
        self.sink = sink
        self.model_name = model_name
        self.counts: Counter[str] = Counter()
        #: every rejection so far (the sum of ``counts``)
        self.total = 0
        self._logged: dict[str, float] = {}

    def response(self, error: ValidationError) -> Any:
        """Count ``error`` and return the error response for its request."""
        reason = error.reason
        self.counts[reason] += 1
        self.total += 1
        now = time.monotonic()
        if now - self._logged.get(reason, -math.inf) >= REJECT_LOG_INTERVAL_S:
            LOGGER.warning(
                "%s: rejected a request (%s, %d so far): %s", self.model_name, reason, self.counts[reason], error
            )
            self._logged[reason] = now
        return self.sink.response(None, str(error), self.sink.pb.TritonError.INVALID_ARG)


@dataclass
class Taken:
    """A batch's requests once read and partitioned (``Mode.take``).

    Attributes:
        items: The valid requests, in order, each with its handle.
        index: Each valid request's position in the batch.
        bad: ``(position, handle, error)`` of each request that is refused.
    """

    items: list[Item] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    bad: list[tuple[int, Any, ValidationError]] = field(default_factory=list)


@dataclass(eq=False)
class Answering:
    """What every mode reads requests and answers them with (one per instance).

    Attributes:
        spec: The model (its value check).
        read: Reads one request (``inflight.runtime.reading.RequestReader``).
        sink: Builds and sends responses.
        rejections: Counts and answers refused requests.
        ranges: NVTX ranges.
        tokenize: Tokenizes a batch's text requests in place and returns the bad ones
            (``RequestReader.tokenize``); None: the model has no text input.
        parse_s: Seconds spent reading requests, by every mode over this instance (the finalize log).
    """

    spec: ModelSpec
    read: Read
    sink: TritonSink
    rejections: Rejections
    ranges: Ranges
    tokenize: Callable[[Sequence[Item]], list[tuple[Item, ValidationError]]] | None = None
    parse_s: float = 0.0


X = TypeVar("X", SyncExecutor, PipelinedExecutor, OverlapExecutor)


class Mode(ABC, Generic[X]):
    """One way of answering batches, over its executor.

    Args:
        executor: Runs the batches; the mode owns it (``close``).
        answering: How requests are read and answered.
    """

    def __init__(self, executor: X, answering: Answering) -> None:
        self.executor: X = executor
        self.answering = answering
        self.spec = answering.spec
        self.read = answering.read
        self.sink = answering.sink
        self.rejections = answering.rejections
        self.ranges = answering.ranges

    def __enter__(self: M) -> M:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def parse_s(self) -> float:
        """Seconds spent reading requests (the finalize log)."""
        return self.answering.parse_s

    @property
    def stats(self) -> ExecutorStats:
        """The executor's counters."""
        return self.executor.stats

    def counters(self) -> tuple[Counters, ...]:
        """Every counter set of the mode, each published and logged by its fields' metadata."""
        return (self.executor.stats,)

    @property
    def slots(self) -> int:
        """The executor's ring size."""
        return len(self.executor.slots)

    #: The mode's name in the load line (its ``mode`` parameter).
    name = ""

    def describe(self) -> str:
        """The mode for the load line: its name, slots and what else it runs with."""
        return f"{self.name} mode, {self.slots} slot(s)"

    def in_flight(self) -> int:
        """Batches (or chunks) on the device now."""
        return self.executor.in_flight()

    def between_executes(self, gap_s: float) -> None:
        """``gap_s`` passed since the previous ``execute()`` returned (only ``auto`` reads it)."""

    def close(self, timeout_s: float = 10.0) -> bool:
        """Drain or fail in-flight work and release the executor; True when nothing was left unfinished."""
        return self.executor.close(timeout_s)

    @abstractmethod
    def handle(self, index: int, request: Any) -> Any:
        """What the executor answers the request at ``index`` through."""

    @abstractmethod
    def execute(self, requests: Sequence[Any]) -> list[Any] | None:
        """Answer a batch: its responses (``None`` for those answered later), or ``None`` for all of them."""

    @abstractmethod
    def fail(self, requests: Sequence[Any], message: str) -> list[Any] | None:
        """Answer every request of an ``execute()`` that raised with ``message`` (those not answered yet)."""

    def take(self, requests: Sequence[Any]) -> Taken:
        """Read every request and partition the valid from the bad: once per batch, before anything is submitted.

        A request that cannot be read fails alone (reason ``unreadable``), as does one with a token id
        or mask value out of range (``partition_values``); the rest of the batch runs.
        """
        t0 = time.perf_counter()
        taken = Taken()
        read: list[tuple[int, Item]] = []
        with self.ranges.range("parse"):
            for i, r in enumerate(requests):
                handle = self.handle(i, r)
                try:
                    inputs, count, seq = self.read(r)
                except ValidationError as e:
                    taken.bad.append((i, handle, e))
                    continue
                except Exception as e:  # not a known bad input: this request fails alone, the batch runs
                    LOGGER.exception("%s: could not read a request", self.rejections.model_name)
                    error = ValidationError(f"could not read this request ({type(e).__name__}: {e})", "unreadable")
                    taken.bad.append((i, handle, error))
                    continue
                read.append((i, Item(inputs=inputs, count=count, seq=seq, handle=handle)))
            position = {id(item): i for i, item in read}
            items = [item for _, item in read]
            if self.answering.tokenize is not None:
                untokenized = self.answering.tokenize(items)
                if untokenized:
                    failed = {id(item) for item, _ in untokenized}
                    items = [item for item in items if id(item) not in failed]
                    taken.bad.extend((position[id(item)], item.handle, e) for item, e in untokenized)
            good, bad = partition_values(self.spec, items)
        taken.items = good
        taken.index = [position[id(item)] for item in good]
        taken.bad.extend((position[id(item)], item.handle, e) for item, e in bad)
        took = time.perf_counter() - t0
        self.answering.parse_s += took
        st = self.executor.stats
        st.parse_max_s = max(st.parse_max_s, took)
        return taken


M = TypeVar("M", bound=Mode[Any])


#: What answers a batch in-band: the sync executor, or a slot of the pipelined ring (``auto``).
InBand = TypeVar("InBand", SyncExecutor, PipelinedExecutor)


#: The executor of a mode that returns every response from ``execute()``.
R = TypeVar("R", SyncExecutor, PipelinedExecutor, OverlapExecutor)


class Returning(Mode[R]):
    """A mode that returns every response from ``execute()``: request positions are the handles.

    Its executor reports each request's outcome to a ``Returned`` sink, which builds the Triton
    response at once (the outputs are views of the executor's buffers).
    """

    def handle(self, index: int, request: Any) -> int:
        """The request's position: its response goes back in the returned list."""
        return index

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        """Run the batch and return one response per request."""
        responses: list[Any] = [None] * len(requests)
        taken = self.take(requests)
        for i, _, error in taken.bad:
            responses[i] = self.rejections.response(error)
        if not taken.items:
            return responses
        returned = Returned(self.sink.response, responses)
        try:
            self.executor.run(Batch(taken.items), returned)
        except Exception as e:  # raised before any request was answered (the executor was closed)
            LOGGER.error("batch failed: %s", e)
            for item in taken.items:
                responses[item.handle] = self.sink.response(None, failed_on_device(e))
        self.sink.build_s += returned.build_s
        return responses

    def fail(self, requests: Sequence[Any], message: str) -> list[Any]:
        """One error response per request."""
        return [self.sink.response(None, message) for _ in requests]


class SyncMode(Returning[InBand]):
    """Wait for the device, return every response (one slot: the stock-equivalent baseline; ``auto``'s in-band path)."""

    name = "sync"


class PipelinedMode(Mode[PipelinedExecutor]):
    """Return ``None`` once the batch is enqueued; every request is answered through its sender."""

    name = "pipelined"

    def describe(self) -> str:
        """Name, slots and sender threads."""
        return f"{super().describe()}, {len(self.executor.pool.threads)} response threads"

    def handle(self, index: int, request: Any) -> Any:
        """The request's response sender."""
        return request.get_response_sender()

    def execute(self, requests: Sequence[Any]) -> None:
        """Enqueue the batch (refused requests are answered at once, through their senders)."""
        executor = self.executor
        with executor.issuing():
            taken = self.take(requests)
            for _, sender, error in taken.bad:
                sender.send(self.rejections.response(error), flags=self.sink.final)
                executor.stats.error_responses += 1
            if not taken.items:
                return None
            try:
                executor.submit(Batch(taken.items))
            except ShuttingDownError as e:
                for item in taken.items:
                    self.sink.send(item.handle, None, str(e))
        return None

    def fail(self, requests: Sequence[Any], message: str) -> None:
        """Send the error through each request's sender, skipping those already answered (their sender is closed)."""
        for r in requests:
            try:
                r.get_response_sender().send(self.sink.response(None, message), flags=self.sink.final)
            except Exception:  # already answered: its sender is closed
                continue


class OverlapMode(Returning[OverlapExecutor]):
    """The batch in chunks overlapped on the GPU; every response returned."""

    name = "overlap"


class AutoMode(Mode[PipelinedExecutor]):
    """Each batch in-band (``SyncMode``'s path) or deferred (``PipelinedMode``'s), as ``policy`` decides.

    Both paths share the instance's one ``PipelinedExecutor``: an in-band batch takes a slot of
    its ring and waits for it (``PipelinedExecutor.run``), a deferred one is submitted. The
    in-band batches measure the overlap bound the policy decides by (``AutoPolicy.ran``).

    Args:
        executor: The ring both paths use; the mode owns it.
        answering: How requests are read and answered.
        policy: The rule (``AutoPolicy``).
    """

    def __init__(self, executor: PipelinedExecutor, answering: Answering, policy: AutoPolicy) -> None:
        super().__init__(executor, answering)
        self.policy = policy
        self._in_band: SyncMode[PipelinedExecutor] = SyncMode(executor, answering)
        self._deferred = PipelinedMode(executor, answering)
        self._current: Mode[PipelinedExecutor] = self._in_band
        self._max_items = max(1, executor.runner.layout.max_items)

    name = "auto"

    def describe(self) -> str:
        """Name, slots, sender threads and the rule it defers by."""
        p = self.policy
        if math.isinf(p.bound_min):
            rule = "in-band only"
        else:
            rule = f"defers from overlap bound {p.bound_min:g}"
            if p.gain_min > 0:
                rule += (
                    f" when a probe gains {p.gain_min:g}x (windows of {p.window_s:g} s at the start of each "
                    f"{p.period_s:g} s)"
                )
        return f"{super().describe()}, {len(self.executor.pool.threads)} response threads, {rule}"

    def between_executes(self, gap_s: float) -> None:
        """Tell the policy the gap before this ``execute()`` (part of the cycle the bound is measured on)."""
        self.policy.between(gap_s)

    def handle(self, index: int, request: Any) -> Any:
        """The handle of the path the current batch takes."""
        return self._current.handle(index, request)

    def execute(self, requests: Sequence[Any]) -> list[Any] | None:
        """Defer the batch, or answer it in-band; either way the policy measures the execute thread's cycle.

        The policy counts each decision and measurement itself (``AutoStats``); the mode only reports what
        each path took.
        """
        defer = self.policy.choose()
        t0 = time.perf_counter()
        if defer:
            self._current = self._deferred
            self._deferred.execute(requests)
            self.policy.deferred(time.perf_counter() - t0, len(requests))
            return None
        st = self.executor.stats
        self._current = self._in_band
        wait0, items0 = st.inline_wait_s, st.items
        responses = self._in_band.execute(requests)
        fill = (st.items - items0) / self._max_items
        self.policy.ran(time.perf_counter() - t0, st.inline_wait_s - wait0, len(requests), fill)
        return responses

    def counters(self) -> tuple[Counters, ...]:
        """The executor's counters and the policy's."""
        return (self.executor.stats, self.policy.stats)

    def fail(self, requests: Sequence[Any], message: str) -> list[Any] | None:
        """Answer as the path the failed batch took answers."""
        return self._current.fail(requests, message)
