"""The asyncio open-loop generator's parts that need no server: HTTP framing, options, the summary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from inflight.errors import ConfigError
from inflight.loadtest import openloop as ol
from inflight.loadtest import rategen as rg
from inflight.loadtest import workload as wl


def _answer(body: bytes, status: int = 200, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_parser_reads_pipelined_answers_split_at_any_byte() -> None:
    stream = _answer(b"first") + _answer(b"", 400, "X-A: 1\r\n") + _answer(b"third body")
    for cut in range(1, len(stream)):
        p = rg.ResponseParser()
        got = p.feed(stream[:cut]) + p.feed(stream[cut:])
        assert [(a.status, a.body) for a in got] == [(200, b"first"), (400, b""), (200, b"third body")], cut
        assert got[1].headers["x-a"] == "1"  # names lower-cased


def test_parser_reads_a_chunked_body() -> None:
    stream = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n"
    stream += _answer(b"next")
    for cut in (1, 30, 50, len(stream) - 3):
        p = rg.ResponseParser()
        got = p.feed(stream[:cut]) + p.feed(stream[cut:])
        assert [a.body for a in got] == [b"hello world", b"next"], cut


@pytest.mark.parametrize(
    ("head", "fragment"),
    [
        (b"SPDY/3 200 OK\r\nContent-Length: 0\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nX: y\r\n\r\n", "neither Content-Length nor chunked"),
    ],
)
def test_parser_names_what_it_cannot_read(head: bytes, fragment: str) -> None:
    with pytest.raises(rg.HttpProtocolError, match=fragment):
        rg.ResponseParser().feed(head)


def test_requests_are_complete_keep_alive_http_requests(tmp_path: Path) -> None:
    w = wl.Workload(model="bert_tiny_null", items=3, seq_len=8, pool=2)
    pool = wl.build_pool(w)
    reqs = rg.build_requests(pool, "bert_tiny_null", "127.0.0.1", 8000)
    assert len(reqs) == 2
    for raw, inputs in zip(reqs, pool.inputs, strict=True):
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        assert lines[0] == "POST /v2/models/bert_tiny_null/infer HTTP/1.1"
        fields = dict(line.split(": ", 1) for line in lines[1:])
        assert int(fields["Content-Length"]) == len(body)
        assert body == wl.http_request(pool.workload.spec, inputs).body
        assert "Connection" not in fields  # HTTP/1.1 keeps the connection open by default


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"rate": 0.0}, "--rate 0.0"),
        ({"duration_s": 0.0}, "--duration"),
        ({"processes": 0}, "--processes 0"),
        ({"max_connections": 0}, "--max-connections 0"),
        ({"check_every": 0}, "--check-every 0"),
        ({"pool_file": Path("/nonexistent/pool.npz")}, "does not exist"),
    ],
)
def test_options_refuse_what_the_run_cannot_use(tmp_path: Path, change: dict[str, object], fragment: str) -> None:
    pool = tmp_path / "pool.npz"
    pool.write_bytes(b"x")
    base: dict[str, object] = {"host": "h", "port": 1, "model": "m", "pool_file": pool, "rate": 10.0, "duration_s": 1.0}
    with pytest.raises(ConfigError, match=fragment):
        rg.GenOptions(**{**base, **change}).check_values()  # type: ignore[arg-type]


def test_summary_adds_up_the_sources_and_their_cpu() -> None:
    a = ol.Lateness(scheduled=100, late=4, very_late=1, completed=98, ok=97, inflight=2, span_s=2.0, stopped=True)
    b = ol.Lateness(scheduled=50, completed=50, ok=50, span_s=2.0, stopped=True)
    reports = [
        {
            "counts": a.to_dict(),
            "failures": {"HTTP 500: x": 1},
            "cpu_s": 0.5,
            "busy": 0.25,
            "peak_connections": 9,
            "connection_waits": 4,
        },
        {"counts": b.to_dict(), "failures": {}, "cpu_s": 0.1, "busy": 0.05, "peak_connections": 3},
    ]
    opts = rg.GenOptions(host="h", port=1, model="m", pool_file=Path("p"), rate=75.0, duration_s=2.0, processes=2)
    s = rg.summarize(reports, opts)
    assert s["requests"] == 148 and s["failures"] == 1 and s["rps"] == pytest.approx(74.0)
    assert s["failure_messages"] == [{"error": "HTTP 500: x", "occurrences": 1}]
    assert s["us_per_request"] == pytest.approx(0.6e6 / 148) and s["busy_max"] == 0.25
    assert s["lateness"]["unanswered"] == 2 and s["lateness"]["very_late"] == 1
    assert s["peak_connections"] == 12 and s["connection_waits"] == 4 and s["options"]["pool_file"] == "p"
    empty = rg.summarize([], opts, ["source 0 failed: OSError: refused"])
    assert empty["requests"] == 0 and math.isnan(empty["us_per_request"]) and empty["errors"]
