"""What the asyncio generator (``inflight.loadtest.rategen``) is asked to do: options, endpoints, requests.

The requests are built once per source from the run's pool file: KServe v2 binary-tensor HTTP
bodies (:func:`inflight.loadtest.workload.http_request`) or serialized gRPC ``ModelInferRequest``
messages (:func:`inflight.loadtest.workload.grpc_request`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from inflight.errors import ConfigError
from inflight.loadtest import schedule
from inflight.loadtest import workload as wl

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
    arrival: schedule.ArrivalDist = "poisson"
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
