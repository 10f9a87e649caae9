"""The load a fault runs under: one request, a request dropped before its answer, the open loop and its tally.

Requests are JSON over HTTP to Triton's KServe endpoint (:func:`send`), or sent on a raw socket closed before
the answer is read (:func:`send_and_drop`); :func:`open_loop` sends Poisson arrivals at a rate while a fault
hits, and :func:`tally` says what became of every request (answered, failed, lost, dropped).
"""

from __future__ import annotations

import collections
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inflight.lab.serve_process import ServeProcess, samples, scrape

#: A request neither answered nor failed within this many seconds is lost.
ANSWER_WITHIN_S = 30.0


SEQ = 16


DEFAULT_FAULT_AT_S = 4.0


def _body(seq: int = SEQ) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "input_ids", "shape": [1, seq], "datatype": "INT64", "data": list(range(101, 101 + seq))},
                {"name": "attention_mask", "shape": [1, seq], "datatype": "INT64", "data": [1] * seq},
            ]
        }
    ).encode()


BODY = _body()


@dataclass
class Outcome:
    """One request: when it was due and done (monotonic s), its HTTP status, its error if it failed.

    ``dropped`` marks a request whose client closed the connection before reading the answer (fault d).
    """

    due: float
    done: float
    status: int | None
    error: str | None
    dropped: bool = False

    @property
    def kind(self) -> str:
        """``answered``, ``failed``, ``lost`` (no answer nor error within :data:`ANSWER_WITHIN_S`) or ``dropped``."""
        if self.dropped:
            return "dropped"
        if self.error is None:
            return "answered"
        return "lost" if self.error.startswith("lost") else "failed"


@contextmanager
def serving(
    repository: Path, workdir: Path, spec: str, *extra: str, timeout_s: float = 300.0
) -> Iterator[ServeProcess]:
    """An ``inflight serve`` of ``spec`` that is serving; killed with whatever it left on the way out."""
    s = ServeProcess(repository, workdir, spec, *extra)
    try:
        s.wait_serving(timeout_s)
        yield s
    finally:
        s.kill_all()


def send(http: str, model: str, due: float) -> Outcome:
    """One inference request; its outcome (an answer must have the ``[1, 128]`` output)."""
    req = urllib.request.Request(f"http://{http}/v2/models/{model}/infer", data=BODY, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=ANSWER_WITHIN_S) as r:
            out = json.loads(r.read())["outputs"][0]
            error = None if out["shape"] == [1, 128] else f"wrong output shape {out['shape']}"
            return Outcome(due, time.monotonic(), int(r.status), error)
    except urllib.error.HTTPError as e:
        detail = e.read()[:160].decode(errors="replace")
        return Outcome(due, time.monotonic(), e.code, f"HTTP {e.code}: {detail}")
    except TimeoutError:
        return Outcome(due, time.monotonic(), None, f"lost: no answer within {ANSWER_WITHIN_S:.0f} s")
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            return Outcome(due, time.monotonic(), None, f"lost: no answer within {ANSWER_WITHIN_S:.0f} s")
        return Outcome(due, time.monotonic(), None, f"connection: {type(reason).__name__}: {reason}")


def send_and_drop(http: str, model: str, due: float, rst: bool, linger_s: float) -> Outcome:
    """Send the request on a raw socket and close it ``linger_s`` later without reading (RST when ``rst``)."""
    host, port = http.rsplit(":", 1)
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {http}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n"
    ).encode()
    try:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(head + BODY)
            time.sleep(linger_s)
            if rst:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError as e:
        return Outcome(due, time.monotonic(), None, f"connection: {type(e).__name__}: {e}", dropped=True)
    return Outcome(due, time.monotonic(), None, None, dropped=True)


def output(http: str, model: str) -> np.ndarray:
    """The model's output for :data:`BODY`."""
    req = urllib.request.Request(f"http://{http}/v2/models/{model}/infer", data=BODY, method="POST")
    with urllib.request.urlopen(req, timeout=ANSWER_WITHIN_S) as r:
        return np.array(json.loads(r.read())["outputs"][0]["data"], dtype=np.float32)


def capacity(http: str, model: str, seconds: float = 4.0, clients: int = 8) -> float:
    """Answered requests per second with ``clients`` sending back to back for ``seconds``."""
    stop = time.monotonic() + seconds
    counts = [0] * clients

    def client(i: int) -> None:
        while time.monotonic() < stop:
            counts[i] += send(http, model, time.monotonic()).error is None

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def open_loop(
    http: str,
    model: str,
    rate: float,
    seconds: float,
    fault: Callable[[], None] | None = None,
    fault_at_s: float = DEFAULT_FAULT_AT_S,
    disconnect_share: float = 0.0,
    seed: int = 32,
    extend: Callable[[], bool] | None = None,
) -> list[Outcome]:
    """Poisson arrivals at ``rate`` for ``seconds``; ``fault()`` runs in its own thread at ``fault_at_s``.

    ``disconnect_share`` of the requests (drawn at random) go through :func:`send_and_drop`. While
    ``extend()`` is true the loop goes on past ``seconds`` (at most :data:`ANSWER_WITHIN_S` x 4 more).
    """
    rng = random.Random(seed)
    fault_thread = threading.Timer(fault_at_s, fault) if fault is not None else None
    futures = []
    drops = 0
    with ThreadPoolExecutor(max_workers=64) as pool:
        t0 = time.monotonic()
        if fault_thread is not None:
            fault_thread.start()
        due = 0.0
        while True:
            due += rng.expovariate(rate)
            if due >= seconds and (extend is None or not extend() or due >= seconds + 4 * ANSWER_WITHIN_S):
                break
            time.sleep(max(0.0, t0 + due - time.monotonic()))
            if disconnect_share and rng.random() < disconnect_share:
                drops += 1
                linger = rng.uniform(0.0, 0.02)
                futures.append(pool.submit(send_and_drop, http, model, t0 + due, drops % 2 == 0, linger))
            else:
                futures.append(pool.submit(send, http, model, t0 + due))
        outcomes = [f.result(timeout=ANSWER_WITHIN_S + 30) for f in futures]
    if fault_thread is not None:
        fault_thread.join(120)
    return outcomes


def busy_after(http: str, metrics_url: str, model: str, rounds: int = 3) -> dict[str, Any]:
    """Busy slots once the load is over: probe batches, then the gauges.

    Each round sends 8 requests at once and then 4 one after the other; the backend publishes its gauges at
    the start of each ``execute()``, so an instance whose ``inflight_batches_total`` advanced during the probes
    has a current ``inflight_in_flight`` (the gauge of an instance that ran no probe, e.g. a dead stub's, is
    reported but not counted). ``busy`` = the current in-flight batches + Triton's pending requests.
    """
    before = samples(scrape(metrics_url), "inflight_batches_total", model)
    answers = []
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(rounds):
            answers += list(pool.map(lambda _: send(http, model, time.monotonic()), range(8)))
            for _ in range(4):
                answers.append(send(http, model, time.monotonic()))
                time.sleep(0.15)
    time.sleep(0.3)
    text = scrape(metrics_url)
    after = samples(text, "inflight_batches_total", model)
    in_flight = samples(text, "inflight_in_flight", model)
    probed = sorted(k for k, v in after.items() if v > before.get(k, 0.0))
    pending = sum(samples(text, "nv_inference_pending_request_count", model).values())
    return {
        "probes": len(answers),
        "probes_answered": sum(o.kind == "answered" for o in answers),
        "in_flight": in_flight,
        "probed_instances": probed,
        "pending_requests": pending,
        "busy": sum(in_flight.get(k, 0.0) for k in probed) + pending,
    }


def check_answers(http: str, model: str, reference: np.ndarray, n: int = 8, rounds: int = 4) -> dict[str, Any]:
    """``rounds`` bursts of ``n`` requests at once: how many answered with ``reference``.

    Bursts, so that every instance gets some: Triton hands a burst to whichever instances are free, and one burst
    of 8 once went wholly to the live instance of two while the other's stub was dead (CI of 2026-11-29), which
    read as recovered.
    """

    def one(_: int) -> str | None:
        try:
            out = output(http, model)
        except (OSError, urllib.error.URLError, KeyError, ValueError) as e:
            return f"{type(e).__name__}: {str(e)[:120]}"
        if out.shape != reference.shape or not np.allclose(out, reference, rtol=1e-5, atol=1e-6):
            return "wrong answer"
        return None

    errors: list[str | None] = []
    with ThreadPoolExecutor(max_workers=n) as pool:
        for _ in range(rounds):
            errors += pool.map(one, range(n))
    bad = [e for e in errors if e]
    return {
        "requests": len(errors),
        "correct": len(errors) - len(bad),
        "errors": dict(collections.Counter(bad)),
        "ok": not bad,
    }


def _failure_key(error: str) -> str:
    """A failure's message cut to 100 characters (the kind it is counted under)."""
    return error[:100]


#: A request sent this long after the fault cannot have been in flight inside the stub it killed.
LOST_MARGIN_S = 1.0


def tally(outcomes: Sequence[Outcome], fault_at: float | None) -> dict[str, Any]:
    """The counts of one fault's open loop: sent, answered, failed, lost, dropped, failures by kind and status."""
    kinds = collections.Counter(o.kind for o in outcomes)
    failed = [o for o in outcomes if o.kind == "failed"]
    before = [o for o in outcomes if fault_at is not None and o.done < fault_at and not o.dropped]
    answered = sorted(o.done - o.due for o in outcomes if o.kind == "answered")
    return {
        "sent": len(outcomes),
        "answered": kinds["answered"],
        "failed": kinds["failed"],
        "lost": kinds["lost"],
        "dropped": kinds["dropped"],
        "failures_by_kind": dict(collections.Counter(_failure_key(o.error or "") for o in failed).most_common()),
        "failures_by_status": dict(
            collections.Counter(str(o.status) if o.status else "no HTTP status" for o in failed).most_common()
        ),
        "slowest_s": max((o.done - o.due for o in outcomes if not o.dropped), default=None),
        "answered_p50_ms": 1e3 * answered[len(answered) // 2] if answered else None,
        "answered_before_fault": sum(o.kind == "answered" for o in before),
        "sent_before_fault": len(before),
        "failed_without_message": sum(1 for o in failed if not o.error),
        # lost requests sent more than LOST_MARGIN_S after the fault: none of them was inside a killed stub
        "lost_sent_after_fault": sum(
            1 for o in outcomes if o.kind == "lost" and fault_at is not None and o.due > fault_at + LOST_MARGIN_S
        ),
    }
