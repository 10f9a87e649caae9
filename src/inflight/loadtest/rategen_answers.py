"""The asyncio generator's answers: HTTP responses parsed off the wire, checked, and binned on a timeline.

Part of :mod:`inflight.loadtest.rategen`: every ``check_every``-th answer is decoded and checked in
full, the others by status and length; each source's timeline bins what it sent, what came back
and its worst latency, and :func:`stall_summary` reads the merged timeline for stalls.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inflight.loadtest import checks
from inflight.loadtest import workload as wl
from inflight.tool_errors import HttpProtocolError

#: Width of a timeline bin (seconds): what each source sent, got answered, and its worst latency per bin.
BIN_S = 0.010

#: An answer slower than this (ms, from its scheduled send time) marks its bin as slow in the stall summary.
STALL_MS = 50.0

#: A bin of the merged timeline is *silent* when fewer answers than this share of the offered rate's came back.
SILENT_SHARE = 0.1


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


def grpc_answer_checker(pool: wl.Pool) -> Callable[[bytes, int], str | None]:
    """Check one serialized ``ModelInferResponse`` against the pool's workload (and its references)."""
    w = pool.workload
    spec, items, tol = w.spec, w.items, wl.tolerance_for(w.model)

    def check(body: bytes, index: int) -> str | None:
        ref = pool.references[index] if pool.references is not None else None
        return checks.check_grpc_body(spec, items, body, ref, tol)

    return check


def answer_checker(pool: wl.Pool) -> Callable[[HttpAnswer, int], str | None]:
    """Check one answer against the pool's workload (and its reference outputs when the pool has them)."""
    w = pool.workload
    spec, items, tol = w.spec, w.items, wl.tolerance_for(w.model)

    def check(answer: HttpAnswer, index: int) -> str | None:
        ref = pool.references[index] if pool.references is not None else None
        return checks.check_http_body(
            spec, items, answer.status, lambda name: answer.headers.get(name.lower()), answer.body, ref, tol
        )

    return check
