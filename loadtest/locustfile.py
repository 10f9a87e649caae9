r"""Locust load test for a Triton model served by inflight (KServe v2 over HTTP or gRPC).

Two user classes; name the one to run on the command line:

* ``TritonHttpUser``: Locust's ``FastHttpUser`` posting the KServe v2 **binary tensor** body
  (built once per distinct input set with ``InferenceServerClient.generate_request_body``,
  ``Inference-Header-Content-Length`` set), responses decoded with ``parse_response_body``;
* ``TritonGrpcUser``: ``GRPCInferenceService/ModelInfer`` through tritonclient.grpc's stub on a
  gevent-enabled gRPC channel, reported through ``environment.events.request.fire`` as in
  Locust's ``examples/grpc``. The ``ModelInferRequest`` messages are prepared once too.

* ``OpenLoopHttpUser``: **open loop** over HTTP: requests *arrive* at ``--rate`` requests per
  second in all (Poisson by default, ``--arrival constant`` for even spacing), whatever the
  server's answers; each Locust user is one source of ``rate / users`` and sends every request in a
  greenlet of its own over a pool of up to ``--max-connections`` keep-alive connections, and
  decodes every ``--check-every``-th answer in full (the others: HTTP 200 and the same length). The
  response time Locust reports is counted from the request's **scheduled** send time, so a late
  send adds to the latency (no coordinated omission); how late the sends were is written with
  the raw latencies (``openloop-*.json``).

Every response is checked for errors, output name, shape and datatype (``--check`` also
compares the values with the model run in PyTorch on the CPU); a bad response is a Locust
failure whose message says what was wrong. ``TritonHttpUser`` and ``TritonGrpcUser`` run
closed loop (no wait time).

Example (a server on localhost, bert_tiny_inflight loaded)::

    locust -f loadtest/locustfile.py --headless -u 100 -r 100 -t 30s --host http://127.0.0.1:8000 \\
        --model bert_tiny_inflight --items 50 --seq-len 64 TritonHttpUser

Open loop, 4000 requests per second from 4 processes (one user each)::

    locust -f loadtest/locustfile.py --headless -u 4 -r 4 -t 30s --processes 4 --host http://127.0.0.1:8000 \\
        --model bert_tiny_inflight --rate 4000 OpenLoopHttpUser

``--raw-latency-dir DIR`` makes every Locust process write the response times of its requests
(float64 milliseconds, exact; Locust's own percentiles round them) to ``DIR`` at test stop,
counted from the end of spawning when ``--reset-stats`` is given.
"""

from __future__ import annotations

# isort: off
# Locust first: it monkey-patches the standard library with gevent before anything else loads.
import locust
from locust import FastHttpUser, User, events, task
from locust.env import Environment
from locust.user.task import LOCUST_STATE_STOPPING
from locust.runners import MasterRunner, WorkerRunner

# isort: on
import contextlib
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.lock
import gevent.pool
import grpc  # type: ignore[import-untyped]
import grpc.experimental.gevent as grpc_gevent  # type: ignore[import-untyped]
from geventhttpclient import HTTPClient
from tritonclient.grpc import service_pb2_grpc

from inflight.errors import ConfigError
from inflight.loadtest import checks, schedule
from inflight.loadtest import openloop as ol
from inflight.loadtest import workload as wl
from inflight.loadtest.locust_master import wait_for_final_reports
from inflight.loadtest.locust_state import LocustProcess

grpc_gevent.init_gevent()

LOGGER = logging.getLogger("inflight.locustfile")
GRPC_MAX_MESSAGE = 2**31 - 1


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    g = parser.add_argument_group("inflight", "Triton workload (inflight load test)")
    g.add_argument("--model", default="bert_tiny_inflight", help="Served model (variant) name.")
    g.add_argument("--items", type=int, default=50, help="Items (batch rows) per request.")
    g.add_argument("--seq-len", type=int, default=64, help="Sequence length (token models).")
    g.add_argument("--token-dist", choices=list(wl.TOKEN_DISTS), default="uniform", help="Token id distribution.")
    g.add_argument(
        "--length-dist",
        choices=list(wl.LENGTH_DISTS),
        default="full",
        help="full: no padding; uniform: random lengths in [1, seq-len] with padding.",
    )
    g.add_argument("--seed", type=int, default=0, help="Seed of the request pool (same seed, same requests).")
    g.add_argument("--pool", type=int, default=16, help="Distinct requests prepared per Locust process.")
    g.add_argument(
        "--pool-file", default="", help="Load the requests (and references) from this .npz (written by `inflight ab`)."
    )
    g.add_argument(
        "--check",
        action="store_true",
        default=False,
        help="Compare every response with the model run in PyTorch on the CPU (needs --repository).",
    )
    g.add_argument(
        "--repository", default="model_repository", help="Model repository holding <model>_inflight/1/model.pt2."
    )
    g.add_argument(
        "--raw-latency-dir", default="", help="Write each process's raw response times (float64 ms) here at test stop."
    )
    g.add_argument("--grpc-url", default="", help="host:port of Triton's gRPC endpoint (default: --host's host, 8001).")
    g.add_argument("--request-timeout", type=float, default=60.0, help="gRPC per-request timeout, seconds.")
    g.add_argument(
        "--rate", type=float, default=0.0, help="OpenLoopHttpUser: requests per second of all users together."
    )
    g.add_argument(
        "--arrival", choices=list(schedule.ARRIVALS), default="poisson", help="OpenLoopHttpUser: arrival process."
    )
    g.add_argument(
        "--check-every",
        type=int,
        default=16,
        help="OpenLoopHttpUser: decode and check every Nth response in full (1: all); the others are checked for "
        "HTTP 200 and the body length of a fully checked answer.",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="OpenLoopHttpUser: keep-alive connections per user; a request finding all busy waits (counted late).",
    )


STATE = LocustProcess()
_ENV: list[Environment] = []


@events.init.add_listener
def _on_init(environment: Environment, **_kw: Any) -> None:
    _ENV.append(environment)
    if isinstance(environment.runner, MasterRunner):
        wait_for_final_reports(environment.runner)
    names = {c.__name__ for c in environment.user_classes}
    if {"TritonHttpUser", "TritonGrpcUser"} <= names and not isinstance(environment.runner, WorkerRunner):
        LOGGER.warning(
            "both TritonHttpUser and TritonGrpcUser are selected, so half the users speak each protocol; "
            "name one on the command line (e.g. `locust -f loadtest/locustfile.py ... TritonHttpUser`)"
        )
    if not isinstance(environment.runner, MasterRunner) and environment.parsed_options is not None:
        # Prepare now, before the master starts the clock (--run-time counts from the start of spawning,
        # test_start handlers included). A worker whose master sends other options prepares again at
        # test start.
        with _not_ready_while(environment.runner):
            STATE.prepare(environment.parsed_options)
    # gevent's timers count from the loop's cached clock, which stands still while the process blocks
    # (imports, the preparation above) and `gevent.spawn_later` does not refresh it: on a busy host
    # Locust's --run-time timer, started right after this, fired at once and the run sent nothing
    gevent.get_hub().loop.update_now()


@contextlib.contextmanager
def _not_ready_while(runner: Any) -> Iterator[None]:
    """A worker is not counted ready by its master inside this block (no-op in other processes).

    Locust's worker tells its master it is ready when it connects, before the ``init`` listeners run; a master
    with ``--expect-workers`` then started the run while the worker still prepared its requests (with ``--check``
    it computes the reference outputs: 34 s on a busy 2-core host), and the whole run passed with no request
    sent. So the worker withdraws ("client_stopped", which makes the master forget it) and connects again when
    done.
    """
    if not isinstance(runner, WorkerRunner):
        yield
        return
    from locust.rpc import Message

    runner.client.send(Message("client_stopped", None, runner.client_id))
    try:
        yield
    finally:
        runner.client.send(Message("client_ready", locust.__version__, runner.client_id))


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kw: Any) -> None:
    if isinstance(environment.runner, MasterRunner):
        return  # the master sends no requests
    options = environment.parsed_options
    assert options is not None
    prepared_before = STATE.key is not None
    if STATE.prepare(options) and prepared_before:
        LOGGER.warning(
            "the master's workload options differ from this worker's command line, so the requests were prepared "
            "again after the clock started; pass the same workload options to the workers"
        )
    STATE.raw_dir = Path(options.raw_latency_dir) if options.raw_latency_dir else None
    del STATE.latencies[:]
    del STATE.sources[:]


@events.request.add_listener
def _on_request(response_time: float, **_kw: Any) -> None:
    STATE.latencies.append(response_time)


@events.spawning_complete.add_listener
def _on_spawning_complete(**_kw: Any) -> None:
    env = locust_environment()
    if env is not None and env.reset_stats:
        del STATE.latencies[:]  # as Locust resets its statistics: measure the steady state only
        now = time.perf_counter()
        for source in STATE.sources:
            source.reset(now)


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_kw: Any) -> None:
    if not isinstance(environment.runner, MasterRunner):
        STATE.write_latencies()


def locust_environment() -> Environment | None:
    """The Locust environment of this process (set at init)."""
    return _ENV[0] if _ENV else None


class TritonHttpUser(FastHttpUser):
    """KServe v2 binary-tensor inference over HTTP, closed loop."""

    host = "http://127.0.0.1:8000"
    network_timeout = 60.0
    connection_timeout = 60.0

    def on_start(self) -> None:
        """Pick this user's first request and the endpoint path."""
        STATE.options_for(self.environment)
        assert STATE.workload is not None
        self._i = STATE.start_index()
        self._n = len(STATE.http)
        self._path = f"/v2/models/{STATE.workload.model}/infer"

    @task
    def infer(self) -> None:
        """Send the next prepared request and check the response."""
        i = self._i
        self._i = (i + 1) % self._n
        req = STATE.http[i]
        # bytes go through as they are (Locust annotates data as str | dict)
        with self.client.post(
            self._path,
            data=req.body,  # type: ignore[arg-type]
            headers=req.headers,
            catch_response=True,
        ) as resp:
            msg = _check_http(resp, i)
            if msg is None:
                resp.success()
            else:
                resp.failure(msg)


def _check_http(resp: Any, index: int) -> str | None:
    status = resp.status_code
    if status != 200 and not status:
        return f"no HTTP response: {resp.error!r} (is the server up at {resp.url}?)"
    return _check_http_body(status, resp.headers.get, resp.content or b"", index)


def _check_http_body(status: int, header: Any, content: bytes, index: int) -> str | None:
    """Check an HTTP answer: its status, then the decoded KServe v2 body (``header(name)`` reads a header)."""
    w = STATE.workload
    assert w is not None
    ref = STATE.references[index] if STATE.references is not None else None
    return checks.check_http_body(w.spec, w.items, status, header, content, ref, STATE.tol)


class OpenLoopHttpUser(User):
    """One source of an open-loop load over HTTP: sends at its scheduled times, whatever the answers.

    The ``-u`` users of a run share ``--rate`` evenly; each draws its own send times
    (:class:`inflight.loadtest.openloop.Schedule`, seeded with ``--seed`` and the user's index), sends
    each request in a new greenlet over a pool of ``--max-connections`` connections, and reports its
    latency from the scheduled send time. When the run stops, the requests still in flight get
    ``STOP_GRACE_S`` (at most ``--stop-timeout``) to be answered; the rest are counted unanswered and
    enter the raw latencies with the time they had waited.
    """

    host = "http://127.0.0.1:8000"

    def on_start(self) -> None:
        """Prepare the requests, the connection pool and this source's schedule."""
        options = STATE.options_for(self.environment)
        assert STATE.workload is not None
        if not options.rate > 0:
            raise ConfigError("OpenLoopHttpUser needs --rate R (requests per second of all users together)")
        if options.max_connections < 1:
            raise ConfigError(f"--max-connections {options.max_connections}: allow at least one connection")
        users = max(1, int(options.num_users or 1))
        runner = self.environment.runner
        worker = int(getattr(runner, "worker_index", 0) or 0)
        # user indices: this process's users are numbered after those of the workers before it
        local = len(STATE.sources)
        per_worker = max(1, math.ceil(users / max(1, int(getattr(options, "processes", 1) or 1))))
        index = min(worker * per_worker + local, users - 1)
        self._schedule = schedule.Schedule(
            options.rate, dist=options.arrival, seed=options.seed, index=index, sources=users
        )
        url = urlsplit(self.environment.host or self.host)
        self._client = HTTPClient(
            url.hostname or "127.0.0.1",
            url.port or 80,
            concurrency=options.max_connections,
            connection_timeout=60.0,
            network_timeout=float(options.request_timeout),
        )
        self._counts = ol.Lateness(started=time.perf_counter())
        STATE.sources.append(self._counts)
        self._due: dict[int, float] = {}  # scheduled send time of every request in flight, by sequence number
        self._seq = 0
        self._greenlets = gevent.pool.Group()
        self._n = len(STATE.http)
        self._i = STATE.start_index()
        self._path = f"/v2/models/{STATE.workload.model}/infer"
        self._name = self._path
        self._fire = self.environment.events.request.fire
        self._stop_timeout = float(options.stop_timeout or 0)
        self._check_every = max(1, int(options.check_every))
        self._length: int | None = None  # body length of a fully checked answer (every answer has the same)

    def on_stop(self) -> None:
        """End the window; give the requests in flight a short grace, then count the rest unanswered.

        A request still unanswered after the grace enters the raw latencies with the time it has
        waited so far (a lower bound of its latency), so a backlog shows in the percentiles.
        """
        self._greenlets.join(timeout=min(self._stop_timeout, STOP_GRACE_S))
        now = time.perf_counter()
        self._counts.stop(now)
        for due in self._due.values():
            STATE.latencies.append((now - due) * 1000.0)
        self._greenlets.kill(block=False)
        self._client.close()

    @task
    def arrivals(self) -> None:
        """Send every request at its scheduled time, for as long as the run lasts."""
        start = time.perf_counter()
        for offset in self._schedule:
            due = start + offset
            wait = due - time.perf_counter()
            if wait > 0:
                gevent.sleep(wait)
            if self._state == LOCUST_STATE_STOPPING:  # the run is over: send nothing more
                return
            i = self._i
            self._i = (i + 1) % self._n
            self._seq += 1
            self._greenlets.spawn(self._send, due, i, self._seq)

    def _send(self, due: float, index: int, seq: int) -> None:
        req = STATE.http[index]
        counts = self._counts
        counts.sent(time.perf_counter() - due)
        self._due[seq] = due
        exc: Exception | None = None
        length = 0
        try:
            resp = self._client.request("POST", self._path, body=req.body, headers=req.headers)
            try:
                content = bytes(resp.read())
            finally:
                resp.release()
            length = len(content)
            if seq % self._check_every == 0 or self._length is None or resp.status_code != 200:
                msg = _check_http_body(resp.status_code, resp.get, content, index)
                if msg is None:
                    self._length = length
            elif length != self._length:
                msg = f"answer of {length} bytes where a checked answer had {self._length}"
            else:
                msg = None
        except Exception as e:  # a broken connection or timeout is a failed request, whatever raised it
            msg = f"no HTTP response: {type(e).__name__}: {e}"
        del self._due[seq]
        counts.done(msg is None)
        if counts.stopped:
            return  # answered after the window: neither achieved nor in Locust's statistics
        if msg is not None:
            exc = HttpCallError(msg)
        self._fire(
            request_type="POST",
            name=self._name,
            response_time=(time.perf_counter() - due) * 1000.0,
            response_length=length,
            exception=exc,
            context={},
        )


#: Seconds the open-loop user waits at the end of a run for the answers still in flight.
STOP_GRACE_S = 1.0


class HttpCallError(Exception):
    """An HTTP request of the open-loop user failed or returned a bad response."""


class GrpcCallError(Exception):
    """A gRPC call failed or returned a bad response."""


class TritonGrpcUser(User):
    """KServe v2 ``ModelInfer`` over gRPC (gevent channel), closed loop."""

    host = "http://127.0.0.1:8000"

    def on_start(self) -> None:
        """Open this user's channel and pick its first request."""
        options = STATE.options_for(self.environment)
        assert STATE.workload is not None
        target = options.grpc_url or _default_grpc_url(self.environment.host or self.host or "")
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
                ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
            ],
        )
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._timeout = float(options.request_timeout)
        self._i = STATE.start_index()
        self._n = len(STATE.grpc)
        self._name = f"{STATE.workload.model}/ModelInfer"
        self._fire = self.environment.events.request.fire

    def on_stop(self) -> None:
        """Close the channel."""
        self._channel.close()

    @task
    def infer(self) -> None:
        """Send the next prepared request and check the response."""
        i = self._i
        self._i = (i + 1) % self._n
        exc: Exception | None = None
        length = 0
        t0 = time.perf_counter()
        try:
            response = self._stub.ModelInfer(STATE.grpc[i], timeout=self._timeout)
        except grpc.RpcError as e:
            elapsed = (time.perf_counter() - t0) * 1000.0
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            exc = GrpcCallError(f"gRPC {code.name if code else 'error'}: {details}")
        else:
            elapsed = (time.perf_counter() - t0) * 1000.0
            length = response.ByteSize()
            msg = _check_grpc(response, i)
            if msg is not None:
                exc = GrpcCallError(msg)
        self._fire(
            request_type="grpc",
            name=self._name,
            response_time=elapsed,
            response_length=length,
            exception=exc,
            context={},
        )


def _check_grpc(response: Any, index: int) -> str | None:
    w = STATE.workload
    assert w is not None
    ref = STATE.references[index] if STATE.references is not None else None
    return checks.check_grpc_response(w.spec, w.items, response, ref, STATE.tol)


def _default_grpc_url(host: str) -> str:
    hostname = urlsplit(host if "://" in host else f"http://{host}").hostname or "127.0.0.1"
    return f"{hostname}:8001"


__all__ = ["OpenLoopHttpUser", "TritonGrpcUser", "TritonHttpUser", "locust"]
