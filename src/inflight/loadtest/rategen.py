r"""A small asyncio open-loop generator beside Locust, for rates Locust cannot hold on its cores.

Why it exists: Locust's open-loop user (:class:`OpenLoopHttpUser` in ``loadtest/locustfile.py``:
gevent, geventhttpclient, Locust's statistics for every request) spends about 220 µs of client CPU
per request. On the GPU host's 16 generator cores it kept its schedule to 40k req/s and fell
behind at 52k (``results/open-loop/20261123-0222-torch-engine/20261123-0245-generator``), while the
capacities this project publishes (two GPUs, the compiled engine) need a generator proven at twice
them.

This generator keeps the Locust user's measurement and drops the rest:

* one process per source (``processes``), each an asyncio loop over ``max_connections``
  keep-alive HTTP/1.1 connections (``asyncio.Protocol``, no HTTP library on the hot path), sending
  requests prepared once from the run's pool file (the KServe v2 binary-tensor body of
  :func:`inflight.loadtest.workload.http_request`);
* send times from :class:`~inflight.loadtest.openloop.Schedule` (Poisson by default; each process
  is one source, so together they offer the rate), independent of the answers;
* latency from each request's *scheduled* send time, lateness of every send counted in
  :class:`~inflight.loadtest.openloop.Lateness` (a request finding every connection busy waits,
  and its wait counts), requests unanswered at the end entered with the time they waited;
* every ``check_every``-th answer decoded and checked in full (shape, datatype, and values with
  a pool that holds references), the others checked by status and length.

With ``protocol="grpc"`` (``--protocol grpc``, ``--url`` then names Triton's gRPC endpoints) each
source sends ``GRPCInferenceService/ModelInfer`` calls through ``grpc.aio`` channels instead
(:class:`_GrpcSource`): the ``ModelInferRequest`` messages of
:func:`inflight.loadtest.workload.grpc_request` are serialized once, sent as bytes, and at most
``max_connections`` calls per source are in flight (a send beyond that waits, and its wait counts,
as a send waits for a free HTTP connection). The schedule, lateness, latencies, timeline and
checks are the same, so the two front ends of one server can be compared under one load.

With several servers (``--url h:p1,h:p2``: one tritonserver per GPU), source ``i`` sends to the
``i % len(urls)``-th; the rate of all sources together is unchanged, so the servers share it as
the sources are spread over them (:func:`source_url`).

It writes the files the A/B runner reads from Locust into ``raw_dir`` (``latencies-*.f64``,
``openloop-*.json``) and, in place of Locust's statistics CSV, a summary JSON
(:data:`SUMMARY_NAME`) with the counts, the failure messages and the generator's own CPU per
request. ``inflight ab --generator asyncio`` uses it for every open-loop window; it also runs on its
own::

    python -m inflight.loadtest.rategen --url 127.0.0.1:8000 --model bert_tiny_null \
        --pool-file pool.npz --rate 20000 --duration 10 --processes 8 --raw-dir /tmp/gen
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
import logging
import math
import multiprocessing as mp
import os
import queue
import socket
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inflight.errors import ConfigError
from inflight.loadtest import openloop as ol
from inflight.loadtest import workload as wl
from inflight.runtime.gcwatch import GcWatch
from inflight.tool_errors import HttpProtocolError

LOGGER = logging.getLogger(__name__)

#: File name, in ``raw_dir``, of the summary the runner reads instead of Locust's statistics.
SUMMARY_NAME = "rategen-summary.json"
#: Seconds between the parent's start signal and the first scheduled send (the workers import and connect).
START_DELAY_S = 2.0
#: Connections each process opens before its first send (more are opened as needed, up to the maximum).
PREOPEN = 16
#: Protocols the generator speaks (``grpc``: Triton's ``GRPCInferenceService/ModelInfer``).
PROTOCOLS = ("http", "grpc")
#: gRPC channels (HTTP/2 connections) per source; calls are spread over them round robin.
GRPC_CHANNELS = 4
#: The gRPC method the generator calls (bytes in, bytes out: the messages are serialized once).
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
#: Seconds a gRPC channel may take to connect before the source gives up (with a message naming the endpoint).
GRPC_CONNECT_TIMEOUT_S = 30.0
#: Largest gRPC message either way (Triton's requests and answers can exceed grpc's 4 MB default).
GRPC_MAX_MESSAGE = 2**30
#: A worker busier than this fraction of its wall time was CPU-bound: the figures may be the generator's.
BUSY_LIMIT = 0.9
#: Width of a timeline bin (seconds): what each source sent, got answered, and its worst latency per bin.
BIN_S = 0.010
#: An answer slower than this (ms, from its scheduled send time) marks its bin as slow in the stall summary.
STALL_MS = 50.0
#: A bin of the merged timeline is *silent* when fewer answers than this share of the offered rate's came back.
SILENT_SHARE = 0.1


def parse_url(text: str) -> tuple[str, int]:
    """``host:port`` (a leading ``http://`` and a trailing ``/`` allowed) as ``(host, port)``.

    Raises:
        ConfigError: when the port is missing or not a number.
    """
    bare = text.strip().split("://", 1)[-1].rstrip("/")
    host, _, port = bare.rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"--url {text!r}: write the server as host:port, e.g. 127.0.0.1:8000")
    return host or "127.0.0.1", int(port)


def parse_urls(text: str) -> list[str]:
    """A comma-separated list of ``host:port`` (one per server) as normalized ``host:port`` strings.

    Raises:
        ConfigError: for an empty list, a malformed entry or a server named twice.
    """
    urls = [":".join(map(str, parse_url(part))) for part in text.split(",") if part.strip()]
    if not urls:
        raise ConfigError(f"--url {text!r} names no server; write host:port[,host:port...]")
    twice = sorted({u for u in urls if urls.count(u) > 1})
    if twice:
        raise ConfigError(f"--url {text!r} names {', '.join(twice)} more than once; list each server once")
    return urls


def source_url(urls: Sequence[str], index: int) -> str:
    """The server source ``index`` sends to: ``urls[index % len(urls)]`` (every server gets every len(urls)-th)."""
    if not urls:
        raise ConfigError("no server to send to; give --url host:port")
    return urls[index % len(urls)]


@dataclass(kw_only=True)
class GenOptions:
    """One open-loop run of the generator.

    Attributes:
        host: Server host.
        port: Server HTTP port.
        urls: Several servers' ``host:port`` (one tritonserver per GPU): source ``i`` sends to
            ``urls[i % len(urls)]`` and ``host``/``port`` are not used; empty: every source sends to
            ``host:port``.
        model: Model name (the request path ``/v2/models/<model>/infer``).
        pool_file: The request pool (``inflight.loadtest.workload.save_pool``), with references for full checks.
        rate: Requests per second of all processes together.
        duration_s: Seconds of sending (the measured window).
        processes: Worker processes, each one arrival source.
        arrival: ``poisson`` or ``constant``.
        seed: Seed of the schedule (the same seed, the same send times).
        max_connections: Keep-alive connections per process at most.
        check_every: Decode and check every Nth answer in full (1: every one).
        raw_dir: Folder for the latency, lateness and summary files.
        stop_grace_s: Seconds after the window for the answers still in flight.
        protocol: ``http`` (KServe v2 binary tensors over HTTP/1.1) or ``grpc``
            (``GRPCInferenceService/ModelInfer``; ``host``/``port``/``urls`` are then gRPC endpoints).
    """

    host: str
    port: int
    model: str
    pool_file: Path
    rate: float
    duration_s: float
    processes: int = 1
    arrival: ol.ArrivalDist = "poisson"
    seed: int = 0
    max_connections: int = 256
    check_every: int = 16
    raw_dir: Path = Path("rategen")
    stop_grace_s: float = 1.0
    urls: tuple[str, ...] = ()
    protocol: str = "http"

    def servers(self) -> list[str]:
        """Every server's ``host:port``, in the order the sources are assigned to them."""
        return list(self.urls) if self.urls else [f"{self.host}:{self.port}"]

    def target(self, index: int) -> tuple[str, int]:
        """``(host, port)`` of the server source ``index`` sends to (:func:`source_url`)."""
        return parse_url(source_url(self.servers(), index))

    def check_values(self) -> None:
        """Raise ConfigError for a value the run cannot use, saying which and what to pass."""
        if not self.rate > 0 or not math.isfinite(self.rate):
            raise ConfigError(f"--rate {self.rate}: offer a positive number of requests per second")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"--protocol {self.protocol!r}: choose one of {', '.join(PROTOCOLS)}")
        if not self.duration_s > 0:
            raise ConfigError(f"--duration {self.duration_s}: send for more than 0 seconds")
        if self.processes < 1:
            raise ConfigError(f"--processes {self.processes}: run at least one process")
        servers = self.servers()
        for url in servers:
            parse_url(url)
        if self.processes < len(servers):
            raise ConfigError(
                f"--processes {self.processes} with {len(servers)} servers in --url: each source sends to one server, "
                f"so some server would get no load; pass --processes {len(servers)} or more"
            )
        if self.processes % len(servers):
            raise ConfigError(
                f"--processes {self.processes} with {len(servers)} servers in --url: each source offers the same rate, "
                f"so the servers would get unequal shares; pass a multiple of {len(servers)}"
            )
        if self.max_connections < 1:
            raise ConfigError(f"--max-connections {self.max_connections}: allow at least one connection")
        if self.check_every < 1:
            raise ConfigError(f"--check-every {self.check_every}: check at least every Nth answer (N >= 1)")
        if not Path(self.pool_file).is_file():
            raise ConfigError(
                f"--pool-file {self.pool_file} does not exist; write one with "
                "`python -m inflight.loadtest.workload --out FILE` (or let `inflight ab` prepare it)"
            )


def build_requests(pool: wl.Pool, model: str, host: str, port: int) -> list[bytes]:
    """Every pool entry as the complete bytes of one HTTP/1.1 keep-alive request."""
    out = []
    for inputs in pool.inputs:
        req = wl.http_request(pool.workload.spec, inputs)
        head = [f"POST /v2/models/{model}/infer HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(req.body)}"]
        head += [f"{k}: {v}" for k, v in req.headers.items()]
        out.append(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + req.body)
    return out


def build_grpc_requests(pool: wl.Pool, model: str) -> list[bytes]:
    """Every pool entry as a serialized ``ModelInferRequest`` (raw input contents), sent as is."""
    return [wl.grpc_request(pool.workload.spec, model, inputs).SerializeToString() for inputs in pool.inputs]


@dataclass
class HttpAnswer:
    """One parsed HTTP response: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


class ResponseParser:
    """Incremental HTTP/1.1 response parser for one connection (Content-Length or chunked bodies)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._head: tuple[int, dict[str, str]] | None = None
        self._need = -1  # body bytes still expected after the head (-2: chunked)

    def feed(self, data: bytes) -> list[HttpAnswer]:
        """Add received bytes; return the responses they complete (in order).

        Raises:
            HttpProtocolError: for a status line or framing this parser does not understand.
        """
        self._buf += data
        done: list[HttpAnswer] = []
        while True:
            if self._head is None:
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    return done
                self._head = self._parse_head(bytes(self._buf[:end]))
                del self._buf[: end + 4]
            answer = self._body()
            if answer is None:
                return done
            done.append(answer)

    def _parse_head(self, head: bytes) -> tuple[int, dict[str, str]]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            self._need = -2
        elif "content-length" in headers:
            self._need = int(headers["content-length"])
        else:
            raise HttpProtocolError(
                f"HTTP {parts[1]} answer with neither Content-Length nor chunked encoding (headers {sorted(headers)})"
            )
        return int(parts[1]), headers

    def _body(self) -> HttpAnswer | None:
        assert self._head is not None
        if self._need >= 0:
            if len(self._buf) < self._need:
                return None
            body = bytes(self._buf[: self._need])
            del self._buf[: self._need]
        else:
            body_or_none = self._chunked()
            if body_or_none is None:
                return None
            body = body_or_none
        status, headers = self._head
        self._head = None
        return HttpAnswer(status, headers, body)

    def _chunked(self) -> bytes | None:
        """The whole chunked body when it has arrived (consumed from the buffer), else None."""
        pos, parts = 0, list[bytes]()
        while True:
            eol = self._buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size = int(bytes(self._buf[pos:eol]).split(b";")[0], 16)
            start = eol + 2
            if size == 0:
                end = self._buf.find(b"\r\n", start)  # no trailers expected: the empty line ends the body
                if end < 0:
                    return None
                del self._buf[: end + 2]
                return b"".join(parts)
            if len(self._buf) < start + size + 2:
                return None
            parts.append(bytes(self._buf[start : start + size]))
            pos = start + size + 2


class Timeline:
    """One source's window in ``BIN_S`` bins: sends, answers, connection waits, worst latency and lateness.

    Bins count from the window's start; events after ``seconds`` are not binned (the counts elsewhere
    keep them). The stall summary (:func:`stall_summary`) merges the sources' timelines: a stall of
    the server shows in every source's bins at once, a stall of one generator process in its own.
    """

    def __init__(self, start: float, seconds: float) -> None:
        n = max(1, math.ceil(seconds / BIN_S))
        self.start = start
        self.sent = array("I", bytes(4 * n))
        self.answered = array("I", bytes(4 * n))
        self.waits = array("I", bytes(4 * n))
        self.latency_max_ms = array("f", bytes(4 * n))
        self.late_max_ms = array("f", bytes(4 * n))

    def _bin(self, t: float) -> int:
        b = int((t - self.start) / BIN_S)
        return b if 0 <= b < len(self.sent) else -1

    def on_send(self, t: float, late_s: float) -> None:
        """A request left at ``t``, ``late_s`` after its scheduled time."""
        b = self._bin(t)
        if b >= 0:
            self.sent[b] += 1
            self.late_max_ms[b] = max(self.late_max_ms[b], late_s * 1e3)

    def on_wait(self, t: float) -> None:
        """A request found every connection busy at ``t``."""
        b = self._bin(t)
        if b >= 0:
            self.waits[b] += 1

    def on_answer(self, t: float, latency_ms: float) -> None:
        """An answer (or failure) arrived at ``t``, ``latency_ms`` after its scheduled send time."""
        b = self._bin(t)
        if b >= 0:
            self.answered[b] += 1
            self.latency_max_ms[b] = max(self.latency_max_ms[b], latency_ms)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (lists per bin)."""
        return {
            "bin_s": BIN_S,
            "sent": self.sent.tolist(),
            "answered": self.answered.tolist(),
            "waits": self.waits.tolist(),
            "latency_max_ms": [round(x, 2) for x in self.latency_max_ms],
            "late_max_ms": [round(x, 2) for x in self.late_max_ms],
        }


def stall_summary(
    timelines: Sequence[dict[str, Any]], rate: float, window_s: float, stall_ms: float = STALL_MS
) -> dict[str, Any]:
    """Where the slow answers of a window came from, from every source's timeline (:meth:`Timeline.to_dict`).

    Args:
        timelines: One per source, all of one window (bins aligned at its start).
        rate: The offered rate (all sources), for what a bin should hold.
        window_s: The sending window (bins past it hold the tail of answers only).
        stall_ms: An answer slower than this marks its bin slow.

    Returns:
        ``slow_bins`` (bins inside the window where some source got an answer over ``stall_ms``),
        ``slow_bins_most_sources`` (of those, bins where at least 80% of the sources that got answers
        got a slow one: the server, or everything between, was slow for all at once),
        ``slow_bins_one_source`` (bins where exactly one source was slow: that generator process),
        ``silent_bins`` (bins inside the window, from the second 100 ms on, where all sources
        together got fewer than ``SILENT_SHARE`` of the offered rate's answers while requests were
        outstanding), ``silent_episodes`` (runs of consecutive silent bins: count, longest and total
        ms, and the first 20 as ``[start_s, ms]``), and ``bin_s``.
    """
    if not timelines:
        return {"bin_s": BIN_S, "sources": 0}
    n = min(len(t["answered"]) for t in timelines)
    inside = min(n, int(window_s / BIN_S))
    answered = np.zeros(n)
    sent = np.zeros(n)
    slow = np.zeros(n, dtype=int)
    active = np.zeros(n, dtype=int)
    for t in timelines:
        a = np.asarray(t["answered"][:n], dtype=float)
        answered += a
        sent += np.asarray(t["sent"][:n], dtype=float)
        slow += np.asarray(t["latency_max_ms"][:n], dtype=float) > stall_ms
        active += a > 0
    outstanding = np.cumsum(sent) - np.cumsum(answered)
    slow_in = slow[:inside]
    active_in = active[:inside]
    most = (slow_in > 0) & (slow_in >= 0.8 * np.maximum(active_in, 1))
    expected = rate * BIN_S
    first = int(0.1 / BIN_S)
    silent = np.zeros(n, dtype=bool)
    silent[first:inside] = (answered[first:inside] < SILENT_SHARE * expected) & (outstanding[first:inside] > 0)
    episodes: list[list[float]] = []
    b = first
    while b < inside:
        if silent[b]:
            e = b
            while e < inside and silent[e]:
                e += 1
            episodes.append([round(b * BIN_S, 3), round((e - b) * BIN_S * 1e3, 1)])
            b = e
        else:
            b += 1
    return {
        "bin_s": BIN_S,
        "sources": len(timelines),
        "stall_ms": stall_ms,
        "bins": inside,
        "slow_bins": int((slow_in > 0).sum()),
        "slow_bins_most_sources": int(most.sum()),
        "slow_bins_one_source": int((slow_in == 1).sum()),
        "silent_bins": int(silent.sum()),
        "silent_episodes": {
            "count": len(episodes),
            "longest_ms": max((e[1] for e in episodes), default=0.0),
            "total_ms": round(sum(e[1] for e in episodes), 1),
            "first": episodes[:20],
        },
    }


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
        schedule = ol.Schedule(
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


def grpc_answer_checker(pool: wl.Pool) -> Callable[[bytes, int], str | None]:
    """Check one serialized ``ModelInferResponse`` against the pool's workload (and its references)."""
    w = pool.workload
    spec, items, tol = w.spec, w.items, wl.tolerance_for(w.model)

    def check(body: bytes, index: int) -> str | None:
        ref = pool.references[index] if pool.references is not None else None
        return wl.check_grpc_body(spec, items, body, ref, tol)

    return check


def answer_checker(pool: wl.Pool) -> Callable[[HttpAnswer, int], str | None]:
    """Check one answer against the pool's workload (and its reference outputs when the pool has them)."""
    w = pool.workload
    spec, items, tol = w.spec, w.items, wl.tolerance_for(w.model)

    def check(answer: HttpAnswer, index: int) -> str | None:
        ref = pool.references[index] if pool.references is not None else None
        return wl.check_http_body(
            spec, items, answer.status, lambda name: answer.headers.get(name.lower()), answer.body, ref, tol
        )

    return check


async def _serve_source(source: _Source, ready: Any, go: Any, start_at: Any) -> None:
    try:
        await source.open(min(PREOPEN, source.options.max_connections))
        ready.put(source.index)
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        start = time.perf_counter() + (start_at.value - time.time())
        await source.run(start)
    finally:
        await source.aclose()


def _worker(options: GenOptions, index: int, ready: Any, go: Any, start_at: Any) -> None:
    """One process: prepare the requests, connect, wait for the start, send, write the files."""
    try:
        pool = wl.load_pool(Path(options.pool_file))
        source: _Source
        if options.protocol == "grpc":
            source = _GrpcSource(options, index, build_grpc_requests(pool, options.model), grpc_answer_checker(pool))
        else:
            requests = build_requests(pool, options.model, *options.target(index))
            source = _Source(options, index, requests, answer_checker(pool))
        # what lives for the whole run (the pool, the prepared requests, numpy, asyncio) leaves the collector's
        # generations: a full collection in the window then walks only what the window made (it was 10-17 ms
        # per source at 38k req/s, 2026-11-23 diag sitting)
        gc.collect()
        gc.freeze()
        asyncio.run(_serve_source(source, ready, go, start_at))
    except Exception as e:  # the parent reports every worker's failure with its cause
        ready.put(f"source {index} failed: {type(e).__name__}: {e}")
        raise SystemExit(2) from None
    raw = Path(options.raw_dir)
    tag = f"{socket.gethostname()}-{os.getpid()}"
    np.frombuffer(source.latencies, dtype=np.float64).astype("<f8").tofile(raw / f"latencies-{tag}.f64")
    (raw / f"openloop-{tag}.json").write_text(json.dumps([source.counts.to_dict()]))
    (raw / f"rategen-{tag}.json").write_text(json.dumps(source.report()))


def summarize(reports: Sequence[dict[str, Any]], options: GenOptions, errors: Sequence[str] = ()) -> dict[str, Any]:
    """The run's summary from every source's report (what the A/B runner reads in place of Locust's CSV).

    Keys: ``requests`` (answered in the window), ``failures``, ``rps`` and ``failures_per_s`` (per
    second of the window), ``failure_messages`` (the most frequent, with counts), ``failures_by_status``
    (every failure per HTTP status, ``other`` for those without one), the generator's
    own CPU (``cpu_s``, ``us_per_request``, ``busy`` per source and ``busy_max``), ``urls`` (the
    servers) and ``per_url`` (per server: its sources and the requests they got answered), ``stalls``
    (:func:`stall_summary` of the sources' timelines), ``generator_gc`` (the sources' garbage-collector
    pauses: longest, total, and the long ones as ``[s, ms, generation, source]``), the options, and
    ``errors`` (sources that did not run).
    """
    counts = ol.Lateness.combine([r["counts"] for r in reports])
    failures: collections.Counter[str] = collections.Counter()
    for r in reports:
        failures.update(r["failures"])
    requests = int(counts["completed"])
    span = counts["span_s"]
    cpu_s = sum(float(r["cpu_s"]) for r in reports)
    busy = [float(r["busy"]) for r in reports]
    urls = options.servers()
    per_url = {u: {"sources": 0, "requests": 0, "ok": 0} for u in urls}
    for r in reports:
        u = r.get("url") or source_url(urls, int(r.get("index", 0)))
        entry = per_url.setdefault(u, {"sources": 0, "requests": 0, "ok": 0})
        entry["sources"] += 1
        entry["requests"] += int(r["counts"].get("completed", 0))
        entry["ok"] += int(r["counts"].get("ok", 0))
    return {
        "generator": "inflight.loadtest.rategen",
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        "urls": urls,
        "per_url": per_url,
        "sources": len(reports),
        "requests": requests,
        "failures": sum(failures.values()),
        "rps": requests / span if span and math.isfinite(span) else math.nan,
        "failures_per_s": sum(failures.values()) / span if span and math.isfinite(span) else math.nan,
        "failure_messages": [{"error": m, "occurrences": n} for m, n in failures.most_common(5)],
        "failures_by_status": wl.failures_by_status(failures.items()),
        "cpu_s": cpu_s,
        "us_per_request": cpu_s * 1e6 / requests if requests else math.nan,
        "busy": busy,
        "busy_max": max(busy, default=math.nan),
        "peak_connections": sum(int(r["peak_connections"]) for r in reports),
        # sends that found every connection busy and waited for one (at the maximum: the server's backlog
        # holds them all; below it: while a new connection opened)
        "connection_waits": sum(int(r.get("connection_waits", 0)) for r in reports),
        "stalls": stall_summary(
            [r["timeline"] for r in reports if r.get("timeline")], options.rate, options.duration_s
        ),
        "generator_gc": {
            "max_ms": max((float(r.get("gc", {}).get("max_ms", 0.0)) for r in reports), default=0.0),
            "total_ms": round(sum(float(r.get("gc", {}).get("total_ms", 0.0)) for r in reports), 2),
            "long": sorted(
                ([*p, int(r["index"])] for r in reports for p in r.get("gc", {}).get("long", [])), key=lambda x: x[0]
            )[:50],
        },
        "lateness": counts,
        "errors": list(errors),
    }


def run(options: GenOptions, *, ready_timeout_s: float = 120.0) -> dict[str, Any]:
    """Run the generator's processes for one window; write and return the summary.

    Raises:
        ConfigError: for options the run cannot use.
    """
    options.check_values()
    raw = Path(options.raw_dir)
    raw.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    ready, go, start_at = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_worker, args=(options, i, ready, go, start_at), name=f"rategen-{i}", daemon=True)
        for i in range(options.processes)
    ]
    errors: list[str] = []
    try:
        for p in procs:
            p.start()
        waiting = options.processes
        deadline = time.monotonic() + ready_timeout_s
        while waiting and not errors:
            try:
                msg = ready.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                errors.append(f"{waiting} of {options.processes} sources not ready after {ready_timeout_s:.0f} s")
                break
            if isinstance(msg, str):
                errors.append(msg)
            waiting -= 1
        start_at.value = time.time() + 0.2
        go.set()
        limit = time.monotonic() + 0.2 + options.duration_s + options.stop_grace_s + 60.0
        for p in procs:
            p.join(timeout=max(0.0, limit - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                errors.append(f"{p.name} did not finish in time; killed")
                p.kill()
                p.join(5)
    errors += [f"{p.name} exited with {p.exitcode}" for p in procs if p.exitcode not in (0, None) and not errors]
    reports = []
    for path in sorted(raw.glob("rategen-*.json")):
        reports.append(json.loads(path.read_text()))
    summary = summarize(reports, options, errors)
    (raw / SUMMARY_NAME).write_text(json.dumps(summary, indent=1, default=float))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: one open-loop window; prints the summary line. Exit 0, 1 (failed requests) or 2."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m inflight.loadtest.rategen", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--url",
        default="127.0.0.1:8000",
        help="server HTTP (or, with --protocol grpc, gRPC) host:port, or several comma-separated (source i sends "
        "to the (i mod n)-th)",
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="http", help="http (binary tensors) or grpc (ModelInfer)")
    p.add_argument("--model", required=True, help="model name to infer")
    p.add_argument("--pool-file", required=True, type=Path, help="request pool (inflight.loadtest.workload --out)")
    p.add_argument("--rate", required=True, type=float, help="requests per second of all processes together")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of sending")
    p.add_argument("--processes", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="sources (processes)")
    p.add_argument("--arrival", choices=ol.ARRIVALS, default="poisson")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-connections", type=int, default=256, help="keep-alive connections per process")
    p.add_argument("--check-every", type=int, default=16, help="decode and check every Nth answer in full")
    p.add_argument("--raw-dir", type=Path, default=Path("rategen"), help="folder for latencies, counts, summary")
    p.add_argument("--stop-grace", type=float, default=1.0, help="seconds for the answers in flight at the end")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        urls = parse_urls(a.url)
        host, port = parse_url(urls[0])
        options = GenOptions(
            host=host,
            port=port,
            urls=tuple(urls) if len(urls) > 1 else (),
            model=a.model,
            pool_file=a.pool_file,
            rate=a.rate,
            duration_s=a.duration,
            processes=a.processes,
            arrival=a.arrival,
            seed=a.seed,
            max_connections=a.max_connections,
            check_every=a.check_every,
            raw_dir=a.raw_dir,
            stop_grace_s=a.stop_grace,
            protocol=a.protocol,
        )
        summary = run(options)
    except (ConfigError, ValueError) as e:
        LOGGER.error("%s", e)
        return 2
    lat = summary["lateness"]
    LOGGER.info(
        "offered %.0f req/s: %d answered (%.0f req/s), %d failures, %.2f%% sent > %.0f ms late, "
        "%d waited for a connection, generator CPU %.1f us/request, busiest source %.0f%%%s",
        options.rate,
        summary["requests"],
        summary["rps"],
        summary["failures"],
        100 * lat.get("very_late_fraction", math.nan),
        ol.LIMIT_LATE_MS,
        summary["connection_waits"],
        summary["us_per_request"],
        100 * summary["busy_max"],
        "" if not summary["errors"] else f"; errors: {'; '.join(summary['errors'])}",
    )
    if summary["busy_max"] > BUSY_LIMIT:
        # the A/B runner reads this line as Locust's own CPU warning: the window's figures may be the generator's
        LOGGER.warning(
            "CPU usage above %.0f%%: the busiest source was busy %.0f%% of its window; give the generator more "
            "cores or --processes",
            100 * BUSY_LIMIT,
            100 * summary["busy_max"],
        )
    for f in summary["failure_messages"]:
        LOGGER.warning("%d x %s", f["occurrences"], f["error"])
    if summary["errors"]:
        return 2
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
