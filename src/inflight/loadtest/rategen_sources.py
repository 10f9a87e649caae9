"""The asyncio generator's sources: one event loop per process sending on its schedule, over HTTP or gRPC.

Part of :mod:`inflight.loadtest.rategen`: an HTTP source keeps up to ``max_connections``
keep-alive HTTP/1.1 connections (``asyncio.Protocol``, no HTTP library on the hot path); a gRPC
source keeps at most ``max_connections`` ``ModelInfer`` calls in flight over ``grpc.aio``
channels. Latency counts from each request's scheduled send time; a send that finds no free
connection waits, and its wait counts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import socket
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inflight.errors import ConfigError
from inflight.loadtest import openloop as ol
from inflight.loadtest.rategen_answers import HttpAnswer, ResponseParser, Timeline
from inflight.loadtest.rategen_options import (
    GRPC_CHANNELS,
    GRPC_CONNECT_TIMEOUT_S,
    GRPC_MAX_MESSAGE,
    GRPC_METHOD,
    PREOPEN,
    GenOptions,
    source_url,
)
from inflight.loadtest.schedule import Schedule
from inflight.runtime.gcwatch import GcWatch
from inflight.tool_errors import HttpProtocolError


@dataclass
class _Pending:
    due: float
    index: int
    seq: int


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, source: _Source) -> None:
        self.source = source
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser()
        self.current: _Pending | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, pending: _Pending, data: bytes) -> None:
        assert self.transport is not None
        self.current = pending
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            answers = self.parser.feed(data)
        except (HttpProtocolError, ValueError) as e:
            self._broken(f"unreadable HTTP answer: {e}")
            return
        for answer in answers:
            pending, self.current = self.current, None
            if pending is None:
                self._broken(f"an HTTP {answer.status} answer arrived with no request in flight")
                return
            self.source.answered(self, pending, answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._broken(f"the server closed the connection ({exc or 'EOF'})")

    def _broken(self, msg: str) -> None:
        pending, self.current = self.current, None
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.source.lost(self, pending, msg)


@dataclass
class _Source:
    """One process's arrival source: its schedule, connections, counts and latencies."""

    options: GenOptions
    index: int
    requests: list[bytes]
    check: Callable[[HttpAnswer, int], str | None]
    counts: ol.Lateness = field(default_factory=ol.Lateness)
    latencies: array[float] = field(default_factory=lambda: array("d"))
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    free: list[_Connection] = field(default_factory=list)
    waiting: collections.deque[_Pending] = field(default_factory=collections.deque)
    conns: set[_Connection] = field(default_factory=set)
    opening: int = 0
    answers: int = 0
    length: int | None = None
    idle: asyncio.Event | None = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    peak_connections: int = 0
    connection_waits: int = 0
    timeline: Timeline | None = None
    gc_pauses: dict[str, Any] = field(default_factory=dict)

    async def _connect(self) -> _Connection:
        """One new connection to the server, counted among this source's connections."""
        loop = asyncio.get_running_loop()
        host, port = self.options.target(self.index)
        _, conn = await loop.create_connection(lambda: _Connection(self), host, port)
        self.conns.add(conn)
        self.peak_connections = max(self.peak_connections, len(self.conns))
        return conn

    async def open(self, n: int) -> None:
        """Open ``n`` connections and put them in the free list."""
        for _ in range(n):
            self.free.append(await self._connect())

    def due(self, pending: _Pending) -> None:
        """A request's send time came: send it on a free connection, or queue it (its wait counts as late)."""
        if self.free:
            self._send(self.free.pop(), pending)
            return
        self._wait(pending)
        if len(self.conns) + self.opening < self.options.max_connections:
            self.opening += 1
            asyncio.get_running_loop().create_task(self._open_one())

    async def _open_one(self) -> None:
        try:
            conn = await self._connect()
        except OSError as e:
            if self.waiting:
                self._finish(self.waiting.popleft(), False, f"cannot connect: {e}")
            return
        finally:
            self.opening -= 1
        self._release(conn)

    def _wait(self, pending: _Pending) -> None:
        """Queue ``pending`` until a connection (or call slot) frees; the wait is counted and binned."""
        self.waiting.append(pending)
        if not self.counts.stopped:
            self.connection_waits += 1
            if self.timeline is not None:
                self.timeline.on_wait(time.perf_counter())

    def _sent(self, pending: _Pending) -> None:
        """Count ``pending`` as sent now, with its lateness."""
        now = time.perf_counter()
        self.counts.sent(now - pending.due)
        if self.timeline is not None:
            self.timeline.on_send(now, now - pending.due)

    def _judge(self, length: int, full_check: Callable[[], str | None], *, force: bool = False) -> str | None:
        """A failure message for an answer of ``length`` bytes, or None.

        The first answer, every ``check_every``-th and any ``force``-d one is checked in full
        (``full_check``); the others by their length against the last answer checked in full.
        """
        self.answers += 1
        if force or self.length is None or self.answers % self.options.check_every == 0:
            msg = full_check()
            if msg is None:
                self.length = length
            return msg
        if length != self.length:
            return f"answer of {length} bytes where a checked answer had {self.length}"
        return None

    def _send(self, conn: _Connection, pending: _Pending) -> None:
        self._sent(pending)
        conn.send(pending, self.requests[pending.index])

    def _release(self, conn: _Connection) -> None:
        if self.waiting:
            self._send(conn, self.waiting.popleft())
        else:
            self.free.append(conn)

    def answered(self, conn: _Connection, pending: _Pending, answer: HttpAnswer) -> None:
        """A complete answer for ``pending`` arrived on ``conn``."""
        msg = self._judge(len(answer.body), lambda: self.check(answer, pending.index), force=answer.status != 200)
        if answer.headers.get("connection", "").lower() == "close":
            self.conns.discard(conn)
            if conn.transport is not None:
                conn.transport.close()
                conn.transport = None
        else:
            self._release(conn)
        self._finish(pending, msg is None, msg)

    def lost(self, conn: _Connection, pending: _Pending | None, msg: str) -> None:
        """``conn`` broke (the request it carried, if any, failed with ``msg``)."""
        if conn in self.free:
            self.free.remove(conn)
        self.conns.discard(conn)
        if pending is not None:
            self._finish(pending, False, msg)

    def _finish(self, pending: _Pending, ok: bool, msg: str | None) -> None:
        self.counts.done(ok)
        if not self.counts.stopped:
            now = time.perf_counter()
            latency_ms = (now - pending.due) * 1000.0
            self.latencies.append(latency_ms)
            if self.timeline is not None:
                self.timeline.on_answer(now, latency_ms)
            if not ok:
                self.failures[msg or "failed"] += 1
        if self.idle is not None and self.counts.inflight == 0:
            self.idle.set()

    async def run(self, start: float) -> None:
        """Send on schedule from ``start`` (perf_counter) for the window, then wait the grace and stop."""
        schedule = Schedule(
            self.options.rate,
            dist=self.options.arrival,
            seed=self.options.seed,
            index=self.index,
            sources=self.options.processes,
        )
        n = len(self.requests)
        end = start + self.options.duration_s
        now = time.perf_counter()
        if start > now:
            await asyncio.sleep(start - now)
        self.counts.reset(start)
        self.timeline = Timeline(start, self.options.duration_s + self.options.stop_grace_s)
        pauses = GcWatch(origin=start)
        cpu0 = time.process_time()
        for seq, offset in enumerate(schedule, 1):
            due = start + offset
            if due >= end:
                break
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            self.due(_Pending(due, (self.index + seq) % n, seq))
        wait = end - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        if self.counts.inflight:
            self.idle = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.idle.wait(), self.options.stop_grace_s)
        now = time.perf_counter()
        self.counts.stop(now)
        self.cpu_s = time.process_time() - cpu0
        gc_figures = pauses.stop()
        self.gc_pauses = {
            "count": gc_figures["gc_collections"],
            "total_ms": round(sum(pauses.pause_s) * 1e3, 2),
            "max_ms": round(pauses.max_pause_s * 1e3, 2),
            "long": pauses.long,
        }
        self.wall_s = now - start
        # still unanswered: the time waited so far (a lower bound of the latency) enters the raw latencies
        unanswered = list(self.waiting) + self.in_flight()
        for p in unanswered:
            self.latencies.append((now - p.due) * 1000.0)
        self.counts.inflight = len(unanswered)

    def in_flight(self) -> list[_Pending]:
        """The requests sent and not answered yet."""
        return [c.current for c in self.conns if c.current is not None]

    async def aclose(self) -> None:
        """Close the source's connections (the asyncio form of :meth:`close`)."""
        self.close()

    def close(self) -> None:
        """Close every connection (answers still in flight are dropped: they were counted unanswered)."""
        for conn in list(self.conns):
            conn.current = None
            if conn.transport is not None:
                conn.transport.close()
        self.conns.clear()
        self.free.clear()
        self.waiting.clear()

    def report(self) -> dict[str, Any]:
        """This source's figures for the summary (JSON)."""
        return {
            "index": self.index,
            "pid": os.getpid(),
            "url": source_url(self.options.servers(), self.index),
            "counts": self.counts.to_dict(),
            "failures": dict(self.failures),
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "busy": self.cpu_s / self.wall_s if self.wall_s > 0 else math.nan,
            "peak_connections": self.peak_connections,
            "connection_waits": self.connection_waits,
            "gc": self.gc_pauses,
            "timeline": self.timeline.to_dict() if self.timeline is not None else None,
        }


class _GrpcSource(_Source):
    """A source that sends ``ModelInfer`` calls over ``GRPC_CHANNELS`` grpc.aio channels.

    ``requests`` holds serialized ``ModelInferRequest`` messages and ``grpc_check`` checks a
    serialized ``ModelInferResponse``; at most ``max_connections`` calls are in flight (the others
    wait in order, each wait counted as a connection wait).
    """

    def __init__(
        self,
        options: GenOptions,
        index: int,
        requests: list[bytes],
        grpc_check: Callable[[bytes, int], str | None],
    ) -> None:
        super().__init__(options, index, requests, lambda answer, i: None)
        self.grpc_check = grpc_check
        self.channels: list[Any] = []
        self.calls: list[Any] = []
        self.pending: dict[int, _Pending] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def open(self, n: int) -> None:
        """Open the channels and wait until each is connected."""
        import grpc  # type: ignore[import-untyped]

        host, port = self.options.target(self.index)
        opts = [
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
        ]
        for _ in range(max(1, min(GRPC_CHANNELS, n))):
            ch = grpc.aio.insecure_channel(f"{host}:{port}", options=opts)
            self.channels.append(ch)  # closed by aclose() whatever happens next
            try:
                await asyncio.wait_for(ch.channel_ready(), GRPC_CONNECT_TIMEOUT_S)
            except asyncio.TimeoutError:  # TimeoutError from 3.11 on; asyncio.wait_for raises this one on 3.10
                raise ConfigError(
                    f"cannot reach a gRPC endpoint at {host}:{port} within {GRPC_CONNECT_TIMEOUT_S:.0f} s; with "
                    "--protocol grpc, --url names Triton's gRPC port (8001 by default), not its HTTP port"
                ) from None
            self.calls.append(ch.unary_unary(GRPC_METHOD))
        self.peak_connections = len(self.channels)

    def due(self, pending: _Pending) -> None:
        """Send now if fewer than ``max_connections`` calls are in flight, else queue (the wait counts)."""
        if len(self.pending) < self.options.max_connections:
            self._start(pending)
            return
        self._wait(pending)

    def _start(self, pending: _Pending) -> None:
        self._sent(pending)
        self.pending[pending.seq] = pending
        task = asyncio.get_running_loop().create_task(self._call(pending))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _call(self, pending: _Pending) -> None:
        import grpc

        call = self.calls[pending.seq % len(self.calls)]
        try:
            body = await call(self.requests[pending.index])
        except grpc.aio.AioRpcError as e:
            msg: str | None = f"gRPC {e.code().name}: {e.details()}"
        else:
            msg = self._judge(len(body), lambda: self.grpc_check(body, pending.index))
        if self.pending.pop(pending.seq, None) is None:
            return  # the source was closed while the call ran: it was counted unanswered
        if self.waiting:
            self._start(self.waiting.popleft())
        self._finish(pending, msg is None, msg)

    def in_flight(self) -> list[_Pending]:
        """The calls sent and not answered yet."""
        return list(self.pending.values())

    async def aclose(self) -> None:
        """Cancel the calls still in flight (counted unanswered) and close the channels."""
        self.pending.clear()
        self.waiting.clear()
        for task in list(self.tasks):
            task.cancel()
        for ch in self.channels:
            await ch.close()
        self.channels.clear()
        self.calls.clear()


async def _serve_source(source: _Source, ready: Any, go: Any, start_at: Any) -> None:
    try:
        await source.open(min(PREOPEN, source.options.max_connections))
        ready.put(source.index)
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        start = time.perf_counter() + (start_at.value - time.time())
        await source.run(start)
    finally:
        await source.aclose()
