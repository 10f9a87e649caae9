"""The asyncio open-loop generator's parts that need no server: HTTP framing, options, the summary."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from inflight.errors import ConfigError
from inflight.loadtest import openloop as ol
from inflight.loadtest import rategen as rg
from inflight.loadtest import rategen_answers, rategen_options, rategen_sources
from inflight.loadtest import workload as wl
from inflight.tool_errors import HttpProtocolError


def _answer(body: bytes, status: int = 200, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_parser_reads_pipelined_answers_split_at_any_byte() -> None:
    stream = _answer(b"first") + _answer(b"", 400, "X-A: 1\r\n") + _answer(b"third body")
    for cut in range(1, len(stream)):
        p = rategen_answers.ResponseParser()
        got = p.feed(stream[:cut]) + p.feed(stream[cut:])
        assert [(a.status, a.body) for a in got] == [(200, b"first"), (400, b""), (200, b"third body")], cut
        assert got[1].headers["x-a"] == "1"  # names lower-cased


def test_parser_reads_a_chunked_body() -> None:
    stream = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n"
    stream += _answer(b"next")
    for cut in (1, 30, 50, len(stream) - 3):
        p = rategen_answers.ResponseParser()
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
    with pytest.raises(HttpProtocolError, match=fragment):
        rategen_answers.ResponseParser().feed(head)


def test_requests_are_complete_keep_alive_http_requests(tmp_path: Path) -> None:
    w = wl.Workload(model="bert_tiny_null", items=3, seq_len=8, pool=2)
    pool = wl.build_pool(w)
    reqs = rategen_options.build_requests(pool, "bert_tiny_null", "127.0.0.1", 8000)
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
        rategen_options.GenOptions(**{**base, **change}).check_values()  # type: ignore[arg-type]


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
    opts = rategen_options.GenOptions(
        host="h", port=1, model="m", pool_file=Path("p"), rate=75.0, duration_s=2.0, processes=2
    )
    s = rg.summarize(reports, opts)
    assert s["requests"] == 148 and s["failures"] == 1 and s["rps"] == pytest.approx(74.0)
    assert s["failure_messages"] == [{"error": "HTTP 500: x", "occurrences": 1}]
    assert s["failures_by_status"] == {"HTTP 500": 1}
    assert s["us_per_request"] == pytest.approx(0.6e6 / 148) and s["busy_max"] == 0.25
    assert s["lateness"]["unanswered"] == 2 and s["lateness"]["very_late"] == 1
    assert s["peak_connections"] == 12 and s["connection_waits"] == 4 and s["options"]["pool_file"] == "p"
    empty = rg.summarize([], opts, ["source 0 failed: OSError: refused"])
    assert empty["requests"] == 0 and math.isnan(empty["us_per_request"]) and empty["errors"]


def _timeline(start: float, events: list[tuple[float, float]], sends: list[float], seconds: float = 2.0) -> dict:
    """A source's timeline: answers as ``(time from start, latency ms)``, sends as times from start."""
    t = rategen_answers.Timeline(start, seconds)
    for at in sends:
        t.on_send(start + at, 0.0)
    for at, latency in events:
        t.on_answer(start + at, latency)
    return t.to_dict()


def test_timeline_bins_sends_answers_and_their_worst_latency() -> None:
    t = rategen_answers.Timeline(100.0, 1.0)
    t.on_send(100.0005, 0.002)
    t.on_send(100.004, 0.0)
    t.on_wait(100.015)
    t.on_answer(100.012, 7.0)
    t.on_answer(100.019, 9.5)
    t.on_answer(101.5, 1.0)  # past the timeline: not binned
    t.on_send(99.0, 0.0)  # before the start: not binned
    d = t.to_dict()
    assert len(d["sent"]) == round(1.0 / rategen_answers.BIN_S)
    assert d["sent"][0] == 2 and sum(d["sent"]) == 2
    assert d["late_max_ms"][0] == pytest.approx(2.0)
    assert d["waits"][1] == 1
    assert d["answered"][1] == 2 and sum(d["answered"]) == 2
    assert d["latency_max_ms"][1] == pytest.approx(9.5)


def test_stall_summary_tells_a_stall_of_all_sources_from_one_of_one_source() -> None:
    rate = 400.0  # 4 sources, one answer each per 10 ms bin
    steady = [(b * rategen_answers.BIN_S + 0.005, 3.0) for b in range(200)]
    sends = [b * rategen_answers.BIN_S + 0.001 for b in range(200)]

    def with_gap(lo: float, hi: float, late_ms: float) -> list[tuple[float, float]]:
        # no answer in [lo, hi), then the ones held back arrive late at hi
        kept = [e for e in steady if not lo <= e[0] < hi]
        return sorted([*kept, (hi + 0.001, late_ms)])

    everyone = [_timeline(0.0, with_gap(0.50, 0.58, 80.0), sends) for _ in range(4)]
    s = rategen_answers.stall_summary(everyone, rate, window_s=2.0)
    assert s["sources"] == 4 and s["bins"] == 200
    assert s["slow_bins"] == 1 and s["slow_bins_most_sources"] == 1 and s["slow_bins_one_source"] == 0
    # no source answered in the gap: one silent episode of its length
    assert s["silent_episodes"]["count"] == 1
    assert s["silent_episodes"]["longest_ms"] == pytest.approx(80.0)
    assert s["silent_episodes"]["first"] == [[0.5, 80.0]]

    one = [_timeline(0.0, with_gap(1.20, 1.30, 120.0), sends)] + [_timeline(0.0, steady, sends) for _ in range(3)]
    s = rategen_answers.stall_summary(one, rate, window_s=2.0)
    assert s["slow_bins"] == 1 and s["slow_bins_most_sources"] == 0 and s["slow_bins_one_source"] == 1
    assert s["silent_episodes"]["count"] == 0

    calm = rategen_answers.stall_summary([_timeline(0.0, steady, sends) for _ in range(4)], rate, window_s=2.0)
    assert calm["slow_bins"] == 0 and calm["silent_bins"] == 0
    assert rategen_answers.stall_summary([], rate, window_s=2.0) == {"bin_s": rategen_answers.BIN_S, "sources": 0}


# -- gRPC ----------------------------------------------------------------------------------------


def test_protocol_must_be_one_the_generator_speaks(tmp_path: Path) -> None:
    pool = tmp_path / "pool.npz"
    pool.write_bytes(b"x")
    opts = rategen_options.GenOptions(
        host="h", port=1, model="m", pool_file=pool, rate=10.0, duration_s=1.0, protocol="quic"
    )
    with pytest.raises(ConfigError, match=r"--protocol 'quic': choose one of http, grpc"):
        opts.check_values()


def test_grpc_requests_are_serialized_model_infer_messages() -> None:
    from tritonclient.grpc import service_pb2

    pool = wl.build_pool(wl.Workload(model="bert_tiny_null", items=3, seq_len=8, pool=2))
    msgs = rategen_options.build_grpc_requests(pool, "bert_tiny_null_x")
    assert len(msgs) == 2
    req = service_pb2.ModelInferRequest.FromString(msgs[1])
    assert req.model_name == "bert_tiny_null_x"
    assert [(i.name, list(i.shape)) for i in req.inputs] == [("input_ids", [3, 8]), ("attention_mask", [3, 8])]
    assert req.raw_input_contents[0] == pool.inputs[1]["input_ids"].tobytes()


def _grpc_response(rows: int, cols: int = 128, datatype: str = "FP32") -> bytes:
    import numpy as np
    from tritonclient.grpc import service_pb2

    r = service_pb2.ModelInferResponse(model_name="m")
    r.outputs.add(name="cls", datatype=datatype, shape=[rows, cols])
    r.raw_output_contents.append(np.zeros((rows, cols), np.float32).tobytes())
    return r.SerializeToString()


def test_grpc_answers_are_checked_like_http_ones() -> None:
    pool = wl.build_pool(wl.Workload(model="bert_tiny_null", items=3, seq_len=8, pool=2))
    check = rategen_answers.grpc_answer_checker(pool)
    assert check(_grpc_response(3), 0) is None
    assert "has shape [2, 128]; expected [3, 128]" in (check(_grpc_response(2), 0) or "")
    assert "undecodable response" in (check(b"\xff\xfe not a protobuf", 1) or "")


def test_rategen_command_speaks_the_shapes_protocol(tmp_path: Path) -> None:
    from inflight.loadtest import presets
    from inflight.loadtest.runner.config import Endpoints
    from inflight.loadtest.runner.plan import rategen_command

    eps = [Endpoints(http=f"127.0.0.1:{p}", grpc=f"127.0.0.1:{p + 1}", metrics="m") for p in (8000, 9000)]
    shape = presets.smoke().replace(users=2, rate=100.0, protocol="grpc")
    cmd = rategen_command(
        shape=shape, model="m", endpoints=eps, duration_s=3, pool_file=tmp_path / "p", raw_dir=tmp_path
    )
    assert cmd[cmd.index("--protocol") + 1] == "grpc"
    assert cmd[cmd.index("--url") + 1] == "127.0.0.1:8001,127.0.0.1:9001"
    http = rategen_command(
        shape=shape.replace(protocol="http"),
        model="m",
        endpoints=eps[0],
        duration_s=3,
        pool_file=tmp_path,
        raw_dir=tmp_path,
    )
    assert http[http.index("--protocol") + 1] == "http" and http[http.index("--url") + 1] == "127.0.0.1:8000"


def test_open_loop_over_grpc_needs_the_asyncio_generator(tmp_path: Path) -> None:
    from inflight.loadtest import presets
    from inflight.loadtest.runner.ab import AbRunner
    from inflight.loadtest.runner.config import AbConfig

    root = Path(__file__).resolve().parents[2]
    cfg: dict[str, Any] = {
        "variants": ["bert_tiny_null"],
        "shape": presets.smoke().replace(protocol="grpc"),
        "repository": root / "model_repository",
        "out": tmp_path,
        "rates": [100.0],
        "generator": "locust",
        "isolate": False,
    }
    with pytest.raises(ConfigError, match=r"Locust's open-loop user .* speaks HTTP only; add --generator asyncio"):
        AbConfig(**cfg)  # the configuration checks itself
    AbRunner(AbConfig(**{**cfg, "generator": "asyncio"}))  # accepted


def test_an_unreachable_grpc_endpoint_fails_the_source_with_what_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(rategen_sources, "GRPC_CONNECT_TIMEOUT_S", 0.5)
    opts = rategen_options.GenOptions(
        host="127.0.0.1", port=port, model="m", pool_file=tmp_path / "p", rate=10.0, duration_s=1.0, protocol="grpc"
    )
    source = rategen_sources._GrpcSource(opts, 0, [b""], lambda body, i: None)

    async def go() -> None:
        try:
            await source.open(4)
        finally:
            await source.aclose()

    with pytest.raises(ConfigError, match=rf"cannot reach a gRPC endpoint at 127.0.0.1:{port} .* gRPC port"):
        asyncio.run(go())
    assert source.channels == []
