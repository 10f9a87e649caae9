"""Faults under load on the CPU host: nothing sent is lost (issue 32, item 5, faults a and c).

``inflight serve`` with bert_tiny_inflight (the pipelined path: responses through ``send()``);
its capacity is measured first (8 clients back to back), then an open loop sends Poisson arrivals
at half of it while a fault hits the server: (a) SIGTERM to ``inflight serve``; (c) the model
unloaded and loaded again through the model-control API. Every request sent must be answered, or
failed with an error that says what happened, within 30 s: lost (neither in 30 s) = 0. Afterwards
the server stopped cleanly with nothing left (a), or the reloaded model answers correctly (c).
Each test prints its row: requests sent / answered / failed / lost and the failures by kind.
"""

from __future__ import annotations

import collections
import json
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from tests.serve_process import Serve

from inflight.server import control
from inflight.server.launcher import port_free

pytestmark = pytest.mark.integration

MODEL = "bert_tiny_inflight"
ANSWER_WITHIN_S = 30.0
SEQ = 16
BODY = json.dumps(
    {
        "inputs": [
            {"name": "input_ids", "shape": [1, SEQ], "datatype": "INT64", "data": list(range(101, 101 + SEQ))},
            {"name": "attention_mask", "shape": [1, SEQ], "datatype": "INT64", "data": [1] * SEQ},
        ]
    }
).encode()


@dataclass
class Outcome:
    """One request: when it was due and answered (monotonic s), its HTTP status, and its error if it failed."""

    due: float
    done: float
    status: int | None
    error: str | None

    @property
    def kind(self) -> str:
        if self.error is None:
            return "answered"
        return "lost" if self.error.startswith("lost") else "failed"


def _send(http: str, due: float) -> Outcome:
    req = urllib.request.Request(f"http://{http}/v2/models/{MODEL}/infer", data=BODY, method="POST")
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


def _capacity(http: str, seconds: float = 4.0, clients: int = 8) -> float:
    """Answered requests per second with ``clients`` sending back to back."""
    stop = time.monotonic() + seconds
    counts = [0] * clients

    def client(i: int) -> None:
        while time.monotonic() < stop:
            counts[i] += _send(http, time.monotonic()).error is None

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def _open_loop(http: str, rate: float, seconds: float, fault: Callable[[], None], fault_at_s: float) -> list[Outcome]:
    """Poisson arrivals at ``rate`` for ``seconds``; ``fault()`` runs in its own thread at ``fault_at_s``."""
    rng = random.Random(32)
    fault_thread = threading.Timer(fault_at_s, fault)
    futures = []
    with ThreadPoolExecutor(max_workers=64) as pool:
        t0 = time.monotonic()
        fault_thread.start()
        due = 0.0
        while True:
            due += rng.expovariate(rate)
            if due >= seconds:
                break
            time.sleep(max(0.0, t0 + due - time.monotonic()))
            futures.append(pool.submit(_send, http, t0 + due))
        outcomes = [f.result(timeout=ANSWER_WITHIN_S + 30) for f in futures]
    fault_thread.join(60)
    return outcomes


def _row(fault: str, outcomes: list[Outcome]) -> str:
    kinds = collections.Counter(o.kind for o in outcomes)
    failures = collections.Counter((o.error or "")[:70] for o in outcomes if o.kind == "failed")
    late = max((o.done - o.due for o in outcomes), default=0.0)
    return (
        f"{fault}: sent {len(outcomes)}, answered {kinds['answered']}, failed {kinds['failed']}, lost {kinds['lost']}; "
        f"slowest {late:.1f} s; failures: {dict(failures.most_common(4))}"
    )


@pytest.fixture
def serving(repository: Path, tmp_path: Path) -> Iterator[Serve]:
    s = Serve(repository, tmp_path, MODEL)
    try:
        s.wait_serving()
        yield s
    finally:
        s.kill_all()


def _check(outcomes: list[Outcome], fault_s: float) -> None:
    assert outcomes, "the open loop sent nothing"
    lost = [o for o in outcomes if o.kind == "lost"]
    assert not lost, f"{len(lost)} request(s) neither answered nor failed within {ANSWER_WITHIN_S:.0f} s"
    assert all(o.done - o.due <= ANSWER_WITHIN_S + 1 for o in outcomes)
    before = [o for o in outcomes if o.done < fault_s]
    assert before and all(o.kind == "answered" for o in before), "requests answered before the fault failed"
    assert all(o.error for o in outcomes if o.kind == "failed"), "a failure without a message"


def test_sigterm_to_serve_under_load_loses_nothing(serving: Serve) -> None:
    rate = 0.5 * _capacity(serving.http)
    t_fault: list[float] = []

    def sigterm() -> None:
        t_fault.append(time.monotonic())
        serving.proc.send_signal(signal.SIGTERM)

    outcomes = _open_loop(serving.http, rate, seconds=10.0, fault=sigterm, fault_at_s=4.0)
    print(f"\n{rate:.0f} req/s offered (half the measured capacity); " + _row("SIGTERM to inflight serve", outcomes))
    _check(outcomes, t_fault[0])
    assert serving.wait_exit(15) == 0, serving.text()[-3000:]
    assert "tritonserver stopped (exit code 0)" in serving.text()
    assert serving.left() == [] and all(port_free(p) for p in serving.ports)
    after = [o for o in outcomes if o.due > t_fault[0] + 5]
    assert after and all(o.kind == "failed" and o.error.startswith("connection") for o in after)  # type: ignore[union-attr]


def _output(http: str) -> np.ndarray:
    req = urllib.request.Request(f"http://{http}/v2/models/{MODEL}/infer", data=BODY, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return np.array(json.loads(r.read())["outputs"][0]["data"], dtype=np.float32)


def test_unload_and_reload_under_load_loses_nothing(serving: Serve) -> None:
    reference = _output(serving.http)
    assert reference.shape == (128,) and np.isfinite(reference).all()
    rate = 0.5 * _capacity(serving.http)
    times: dict[str, float] = {}

    def reload() -> None:
        times["unload"] = time.monotonic()
        control.unload(serving.http, MODEL, timeout_s=60)
        client = control.http_client(serving.http, network_timeout=120)
        try:
            client.load_model(MODEL)
        finally:
            client.close()
        times["loaded"] = time.monotonic()

    outcomes = _open_loop(serving.http, rate, seconds=14.0, fault=reload, fault_at_s=4.0)
    print(f"\n{rate:.0f} req/s offered (half the measured capacity); " + _row("unload and reload", outcomes))
    assert "loaded" in times, "the reload did not finish"
    _check(outcomes, times["unload"])
    after = [o for o in outcomes if o.due > times["loaded"] + 0.5]
    assert after and all(o.kind == "answered" for o in after), _row("after the reload", after)
    # the reloaded model answers correctly: the same output as before the fault (the same artifact)
    np.testing.assert_allclose(_output(serving.http), reference, rtol=1e-5, atol=1e-6)
