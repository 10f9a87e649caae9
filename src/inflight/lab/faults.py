"""Faults under load (issue 32, item 5): what the server does with every request when something breaks.

Each fault runs against its own ``inflight serve`` child process (``bert_tiny_inflight`` at two
instances by default: the pipelined path, responses through ``send()``). Its capacity is measured
first (clients sending back to back), then an open loop sends Poisson arrivals at half of it while
the fault hits:

* ``a``: SIGTERM to ``inflight serve``; the replacement (a new ``inflight serve``) must answer correctly;
* ``b``: SIGKILL to one instance's ``triton_python_backend_stub`` (a child of tritonserver, found
  through /proc); what Triton does is recorded, and when the model does not answer correctly
  afterwards, the recovery (an unload and reload of the model) is done and recorded;
* ``c``: the model unloaded and loaded again (with the same configuration) through the model-control API;
* ``d``: 1% of the requests sent on a raw socket that is closed before the answer is read
  (half with a FIN, half with a RST); the stubs' resident memory (VmRSS) is sampled meanwhile.

Every request sent (but the deliberately dropped ones of ``d``) must be answered, or failed with an
error that says what happened, within :data:`ANSWER_WITHIN_S`: lost (neither) = 0 is the target.
Afterwards the server (or its replacement) must answer correctly (the same output as before the
fault) and no slot may stay busy (the backend's ``inflight_in_flight`` gauge of every instance that
ran a probe batch, and Triton's ``nv_inference_pending_request_count``, are 0).

``python -m inflight.lab.faults --out results/faults/<date>-<device>`` writes ``faults.json`` there;
:func:`section` turns the sittings under ``results/faults`` into the RESULTS "Faults" section.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import functools
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

import inflight
from inflight.lab.sections import fmt
from inflight.server.launcher import free_ports, port_free
from inflight.tool_errors import ServerError

#: A request neither answered nor failed within this many seconds is lost.
ANSWER_WITHIN_S = 30.0
#: The open loop's rate as a share of the measured capacity.
RATE_SHARE = 0.5
#: The share of requests whose client disconnects before reading the answer (fault d).
DISCONNECT_SHARE = 0.01
#: Stub memory counts as flat when the median of the last third of the samples exceeds the first third's by
#: no more than this (MiB), for every stub.
RSS_FLAT_MIB = 20.0
DEFAULT_MODEL = "bert_tiny_inflight"
DEFAULT_INSTANCES = 2
SEQ = 16
FAULTS = {
    "a": "SIGTERM to inflight serve",
    "b": "kill -9 of one instance's stub",
    "c": "unload and reload of the model",
    "d": "1% of clients disconnecting mid-request",
}
#: Seconds of open loop per fault and when the fault hits (d: the disconnects run the whole time).
DEFAULT_LOAD_S = {"a": 10.0, "b": 20.0, "c": 16.0, "d": 120.0}
DEFAULT_FAULT_AT_S = 4.0
#: How long the recovery of (b) waits for the unload before it replaces the server instead.
RELOAD_TIMEOUT_S = 60.0
FAULTS_DIR = "faults"
SRC = Path(inflight.__file__).resolve().parents[1]


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


class ServeProcess:
    """One ``inflight serve`` child process, its output collected by threads (stdout lines with arrival times).

    Args:
        repository: The model repository.
        workdir: ``inflight serve``'s workdir (backends and the server log); its path marks this run's processes.
        model: The ``-m`` argument (``NAME`` or ``NAME@key=value,...``).
        *extra: More ``inflight serve`` arguments.
    """

    def __init__(self, repository: Path, workdir: Path, model: str, *extra: str) -> None:
        self.workdir = workdir
        http, grpc, metrics = free_ports(3)
        self.ports = (http, grpc, metrics)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "inflight.cli", "serve", "--repository", str(repository), "-m", model,
                "--http-port", str(self.ports[0]), "--grpc-port", str(self.ports[1]),
                "--metrics-port", str(self.ports[2]), "--workdir", str(workdir), *extra,
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.out: list[tuple[float, str]] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream: IO[str], stdout: bool) -> None:
        for line in stream:
            (self.out.append((time.monotonic(), line)) if stdout else self.err.append(line))

    @property
    def http(self) -> str:
        """``host:port`` of the HTTP endpoint."""
        return f"127.0.0.1:{self.ports[0]}"

    @property
    def metrics(self) -> str:
        """The metrics endpoint's URL."""
        return f"http://127.0.0.1:{self.ports[2]}/metrics"

    def printed(self, text: str) -> float | None:
        """When a stdout line containing ``text`` arrived, or None."""
        return next((t for t, line in self.out if text in line), None)

    def wait_serving(self, timeout_s: float = 300.0) -> float:
        """Wait for the ``serving`` line; return when it came.

        Raises:
            ServerError: when the process exited or printed no such line within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            t = self.printed("serving ")
            if t is not None:
                return t
            time.sleep(0.1)
        raise ServerError(f"serve printed no 'serving' line (rc {self.proc.poll()}):\n{self.text()[-4000:]}")

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status, or None when still running after ``timeout_s``."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def text(self) -> str:
        """Everything printed so far (stdout, then stderr)."""
        for t in self._threads:
            t.join(5) if self.proc.poll() is not None else None
        return "".join(line for _, line in self.out) + "".join(self.err)

    def left(self) -> list[str]:
        """Processes of this run still alive: tritonserver and its stubs name the workdir in their command line."""
        return [f"{pid}: {' '.join(args)[:160]}" for pid, args in self._mine()]

    def _mine(self) -> list[tuple[int, list[str]]]:
        mark = str(self.workdir)
        return [(pid, args) for pid, args in _processes() if pid != self.proc.pid and any(mark in a for a in args)]

    def tritonserver_pid(self) -> int | None:
        """The pid of this run's tritonserver, or None."""
        return next((pid for pid, args in self._mine() if args and args[0].endswith("/tritonserver")), None)

    def stubs(self, model: str) -> dict[str, int]:
        """The live ``triton_python_backend_stub`` processes of ``model``'s instances: pid by instance name."""
        server = self.tritonserver_pid()
        out = {}
        for pid, args in self._mine():
            # stub argv: path, model.py, shm region, sizes, parent pid, backend dir, ..., instance name, ...
            if args and args[0].endswith("triton_python_backend_stub") and str(server) in args and _ppid(pid) == server:
                name = next((a for a in args[1:] if re.fullmatch(re.escape(model) + r"_\d+_\d+", a)), None)
                if name:
                    out[name] = pid
        return out

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM to ``inflight serve``; its exit status (None: still running after ``timeout_s``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout_s)

    def kill_all(self) -> None:
        """Clean-up on failure: the serve process and whatever of its run is left."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid, _ in self._mine():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _processes() -> Iterator[tuple[int, list[str]]]:
    """Live (not zombie) processes with their argv."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            raw = cmdline.read_bytes()
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if raw and state != "Z":
            yield int(cmdline.parent.name), [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def rss_mib(pid: int) -> float | None:
    """VmRSS of ``pid`` in MiB (from /proc/<pid>/status), or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


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


def scrape(metrics_url: str) -> str:
    """The metrics endpoint's text."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        return str(r.read().decode())


_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$")


def samples(text: str, name: str, model: str) -> dict[str, float]:
    """``name``'s samples of ``model`` by their label set (``instance=...,pid=...``), from metrics text."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model") != model:
            continue
        key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("model", "version"))
        out[key] = float(m.group(3))
    return out


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


def check_answers(http: str, model: str, reference: np.ndarray, n: int = 8) -> dict[str, Any]:
    """``n`` requests (at once, so that every instance gets some): how many answered with ``reference``."""

    def one(_: int) -> str | None:
        try:
            out = output(http, model)
        except (OSError, urllib.error.URLError, KeyError, ValueError) as e:
            return f"{type(e).__name__}: {str(e)[:120]}"
        if out.shape != reference.shape or not np.allclose(out, reference, rtol=1e-5, atol=1e-6):
            return "wrong answer"
        return None

    with ThreadPoolExecutor(max_workers=n) as pool:
        errors = list(pool.map(one, range(n)))
    bad = [e for e in errors if e]
    return {"requests": n, "correct": n - len(bad), "errors": dict(collections.Counter(bad)), "ok": not bad}


def _failure_key(error: str) -> str:
    """A failure's message cut to 100 characters (the kind it is counted under)."""
    return error[:100]


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


#: A request sent this long after the fault cannot have been in flight inside the stub it killed.
LOST_MARGIN_S = 1.0


def rss_flat(series: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Whether each stub's RSS stayed flat: the last third's median at most :data:`RSS_FLAT_MIB` above the first's."""
    per: dict[str, dict[str, float | None]] = {}
    for name, values in series.items():
        if len(values) < 3:
            per[name] = {"start_mib": None, "end_mib": None, "growth_mib": None}
            continue
        third = len(values) // 3
        first, last = statistics.median(values[:third]), statistics.median(values[-third:])
        per[name] = {"start_mib": first, "end_mib": last, "growth_mib": last - first}
    growths = [p["growth_mib"] for p in per.values()]
    flat = bool(growths) and all(g is not None and g <= RSS_FLAT_MIB for g in growths)
    return {"criterion_mib": RSS_FLAT_MIB, "stubs": per, "flat": flat}


class RssSampler:
    """Samples the VmRSS of a model's stubs every ``every_s`` in a thread while in its ``with`` block."""

    def __init__(self, serve: ServeProcess, model: str, every_s: float = 2.0) -> None:
        self.serve, self.model, self.every_s = serve, model, every_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            stubs = self.serve.stubs(self.model)
            rss = {name: rss_mib(pid) for name, pid in sorted(stubs.items())}
            self.samples.append({"t_s": round(time.monotonic() - self._t0, 2), "rss_mib": rss})
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def series(self) -> dict[str, list[float]]:
        """RSS (MiB) per stub over the samples it was alive in."""
        out: dict[str, list[float]] = {}
        for s in self.samples:
            for name, v in s["rss_mib"].items():
                if v is not None:
                    out.setdefault(name, []).append(v)
        return out


@dataclass
class FaultConfig:
    """What one sitting runs: the model variant, the open loop's lengths, where the servers run."""

    repository: Path
    workdir: Path
    model: str = DEFAULT_MODEL
    instances: int = DEFAULT_INSTANCES
    load_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LOAD_S))
    fault_at_s: float = DEFAULT_FAULT_AT_S
    capacity_s: float = 4.0
    capacity_clients: int = 8
    server_cpus: str | None = None
    serve_args: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        """``inflight serve``'s ``-m`` argument."""
        return f"{self.model}@instances={self.instances}"

    def serve_extra(self) -> tuple[str, ...]:
        """More ``inflight serve`` arguments (``--cpus``)."""
        return (("--cpus", self.server_cpus) if self.server_cpus else ()) + self.serve_args

    def as_dict(self) -> dict[str, Any]:
        """The configuration as the JSON file records it."""
        return {
            "model": self.model,
            "instances": self.instances,
            "serve_model_arg": self.spec,
            "load_s": self.load_s,
            "fault_at_s": self.fault_at_s,
            "rate_share_of_capacity": RATE_SHARE,
            "capacity_s": self.capacity_s,
            "capacity_clients": self.capacity_clients,
            "answer_within_s": ANSWER_WITHIN_S,
            "disconnect_share": DISCONNECT_SHARE,
            "rss_flat_mib": RSS_FLAT_MIB,
            "request": f"input_ids and attention_mask [1, {SEQ}] INT64; answer: cls [1, 128] FP32",
            "server_cpus": self.server_cpus,
        }


def _log_lines(path: Path, since: int, pattern: str = r"^[EW]\d{4}|stub|Stub|unhealthy|restart") -> list[str]:
    """Lines of the server log after byte ``since`` that match ``pattern`` (warnings, errors, stub news)."""
    try:
        with path.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    lines = [line[:300] for line in text.splitlines() if re.search(pattern, line)]
    return lines[:40]


def _model_ready(http: str, model: str) -> bool | None:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/models/{model}/ready", timeout=10) as r:
            return bool(r.status == 200)
    except urllib.error.HTTPError:
        return False
    except OSError:
        return None


def _reload(cfg: FaultConfig, http: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Unload the model and load it again with the sitting's configuration; what happened and how long it took."""
    from inflight.server import control

    t0 = time.monotonic()
    out: dict[str, Any] = {}
    try:
        control.unload(http, cfg.model, timeout_s=timeout_s)
        out["unload_s"] = time.monotonic() - t0
        vc = control.variant_config(cfg.repository, cfg.model, {"instances": str(cfg.instances)})
        out["load_s"] = control.load_variant(http, vc, timeout_s=timeout_s)
        out["ok"] = True
    except Exception as e:  # recorded: the sitting says what the reload did
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    out["seconds"] = time.monotonic() - t0
    return out


def run_fault(key: str, cfg: FaultConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run fault ``key`` (``a``...``d``) against a fresh ``inflight serve``; its result block.

    The block holds the open loop's counts (:func:`tally`), the rate, the recovery check (the model's answers
    afterwards, from the replacement server for ``a``), the busy slots afterwards (:func:`busy_after`), what the
    server did (``a``: exit status and processes left; ``b``: the stubs before and after, the model's
    readiness, the server log's lines about the stub, the reload when one was needed), and for ``d`` the
    stubs' RSS samples and whether they stayed flat (:func:`rss_flat`).
    """
    if key not in FAULTS:
        raise ValueError(f"unknown fault {key!r}: use one of {', '.join(FAULTS)}")
    workdir = cfg.workdir / f"fault-{key}"
    if workdir.exists():
        shutil.rmtree(workdir)
    seconds = cfg.load_s[key]
    result: dict[str, Any] = {"fault": key, "name": FAULTS[key], "load_s": seconds}
    with serving(cfg.repository, workdir / "server", cfg.spec, *cfg.serve_extra()) as s:
        reference = output(s.http, cfg.model)
        cap = capacity(s.http, cfg.model, cfg.capacity_s, cfg.capacity_clients)
        if cap <= 0:
            raise ServerError(f"no request answered while measuring the capacity of {cfg.spec}")
        rate = RATE_SHARE * cap
        result.update(capacity_rps=cap, rate_rps=rate)
        log(f"fault {key} ({FAULTS[key]}): capacity {cap:.1f} req/s, offering {rate:.1f} req/s for {seconds:.0f} s")
        stubs_before = s.stubs(cfg.model)
        log_path = workdir / "server" / "tritonserver.log"
        log_at = log_path.stat().st_size if log_path.is_file() else 0
        times: dict[str, float] = {}
        replace = key == "a"
        notes: dict[str, Any] = {"stubs_before": stubs_before}

        def sigterm() -> None:
            times["fault"] = time.monotonic()
            s.proc.send_signal(signal.SIGTERM)

        def kill_stub() -> None:
            name, pid = sorted(stubs_before.items())[-1]
            times["fault"] = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            notes["killed"] = {"instance": name, "pid": pid}

        def reload() -> None:
            times["fault"] = time.monotonic()
            notes["reload"] = _reload(cfg, s.http)
            times["loaded"] = time.monotonic()

        fault: Callable[[], None] | None = {"a": sigterm, "b": kill_stub, "c": reload}.get(key)
        if key == "d":
            times["fault"] = time.monotonic()
            with RssSampler(s, cfg.model) as sampler:
                outcomes = open_loop(s.http, cfg.model, rate, seconds, disconnect_share=DISCONNECT_SHARE)
            result["rss"] = {"samples": sampler.samples, **rss_flat(sampler.series())}
        else:
            # (c) goes on until 4 s after the reload finished, so that requests after it are measured
            def until_reloaded() -> bool:
                return key == "c" and ("loaded" not in times or time.monotonic() < times["loaded"] + 4.0)

            outcomes = open_loop(
                s.http, cfg.model, rate, seconds, fault=fault, fault_at_s=cfg.fault_at_s, extend=until_reloaded
            )
        result.update(tally(outcomes, times.get("fault")))
        if "fault" in times and key != "d":
            after = [o for o in outcomes if o.due > times["fault"] + 5 and not o.dropped]
            result["after_fault_5s"] = dict(collections.Counter(o.kind for o in after))
        if "loaded" in times:
            after = [o for o in outcomes if o.due > times["loaded"] + 0.5]
            result["after_reload"] = dict(collections.Counter(o.kind for o in after))
        log(
            f"fault {key}: sent {result['sent']}, answered {result['answered']}, failed {result['failed']}, "
            f"lost {result['lost']}, dropped {result['dropped']}; failures {result['failures_by_kind']}"
        )
        if key == "a":
            code = s.wait_exit(60)
            result["server"] = {
                "serve_exit_code": code,
                "clean_stop_line": "tritonserver stopped (exit code 0)" in s.text(),
                "processes_left": s.left(),
                "ports_free": all(port_free(p) for p in s.ports),
            }
        else:
            if key == "b":
                notes["model_ready_after"] = _model_ready(s.http, cfg.model)
                notes["stubs_after"] = s.stubs(cfg.model)
                notes["server_log"] = _log_lines(log_path, log_at)
            check = check_answers(s.http, cfg.model, reference)
            recovery: dict[str, Any] = {"check": check, "how": "none needed" if check["ok"] else None}
            if not check["ok"] and key == "b":
                # Triton 2.51 does not restart the stub: the instance fails every request it gets until the model
                # is loaded again; the recovery tried first is an unload and reload
                result["busy_before_recovery"] = busy_after(s.http, s.metrics, cfg.model, rounds=1)
                recovery["reload"] = _reload(cfg, s.http, timeout_s=RELOAD_TIMEOUT_S)
                recovery["how"] = "unload and reload of the model"
                if recovery["reload"]["ok"]:
                    recovery["check_after_reload"] = check = check_answers(s.http, cfg.model, reference)
                    notes["stubs_after_reload"] = s.stubs(cfg.model)
                else:
                    recovery["how"] = "unload and reload failed; a new inflight serve"
                    replace = True
            recovery["recovered"] = bool(check["ok"])
            result["recovery"] = recovery
            if not replace:
                result["busy_after"] = busy_after(s.http, s.metrics, cfg.model)
            code = s.stop(90)
            result["server"] = {
                "serve_exit_code": code,
                "clean_stop_line": "tritonserver stopped (exit code 0)" in s.text(),
                "stop_reason": next((line for _, line in s.out if "tritonserver stopped" in line), "").strip()[:400],
                "processes_left": s.left(),
            }
        result["notes"] = notes
        if "loaded" in times and "fault" in times:
            result["reload_s"] = times["loaded"] - times["fault"]
    if replace:  # a new inflight serve answers correctly and leaves no slot busy
        with serving(cfg.repository, workdir / "replacement", cfg.spec, *cfg.serve_extra()) as r:
            check = check_answers(r.http, cfg.model, reference)
            rec = result.setdefault("recovery", {"how": "a new inflight serve"})
            rec["check_replacement"] = check
            rec["recovered"] = bool(check["ok"])
            result["busy_after"] = busy_after(r.http, r.metrics, cfg.model)
            r.stop(90)
    return result


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "inflight": inflight.__version__}
    for name in ("numpy", "torch", "tritonclient", "nvidia_pytriton"):
        try:
            from importlib.metadata import version

            out[name] = version(name.replace("_", "-"))
        except Exception:  # a package not installed is recorded as such
            out[name] = None
    try:
        out["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=SRC, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out["git_commit"] = None
    return out


def host_info() -> dict[str, Any]:
    """The host: name, CPU model, cores, this process's CPU set, the GPU (``nvidia-smi``) if any."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            gpus = [line.strip() for line in r.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    return {
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "client_cpus": _cpu_list(sorted(os.sched_getaffinity(0))),
        "gpus": gpus,
        "device": gpus[0].split(",")[0] if gpus else "CPU (no GPU)",
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpu_list(cpus: Sequence[int]) -> str:
    """``0-3,6`` from ``[0, 1, 2, 3, 6]``."""
    parts: list[str] = []
    for c in cpus:
        if parts and int(parts[-1].rsplit("-", 1)[-1]) == c - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{c}"
        else:
            parts.append(str(c))
    return ",".join(parts)


def run_sitting(cfg: FaultConfig, out: Path, keys: Sequence[str], log: Callable[[str], None] = print) -> Path:
    """Run the faults ``keys`` one after the other; write ``out/faults.json`` after each; return its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "faults.json"
    doc: dict[str, Any] = {
        "schema": 1,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host_info(),
        "versions": _versions(),
        "cpu_sets": {"client": host_info()["client_cpus"], "server": cfg.server_cpus},
        "config": cfg.as_dict(),
        "command": " ".join(["python -m inflight.lab.faults", *sys.argv[1:]]),
        "faults": [],
    }
    for key in keys:
        doc["faults"].append(run_fault(key, cfg, log))
        path.write_text(json.dumps(doc, indent=1) + "\n")
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inflight.lab.faults``: run the faults and write ``faults.json``; exit 1 when one lost requests."""
    p = argparse.ArgumentParser(prog="python -m inflight.lab.faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="Folder for faults.json (results/faults/<date>-<device>).")
    p.add_argument("--faults", default="a,b,c,d", help="Which faults, comma-separated (default a,b,c,d).")
    p.add_argument("--duration-s", type=float, default=DEFAULT_LOAD_S["d"], help="Seconds of open loop for (d).")
    p.add_argument(
        "--load-s", type=float, default=None, help="Seconds of open loop for (a), (b), (c) (default 10, 20, 16)."
    )
    p.add_argument("--repository", type=Path, default=Path("model_repository"), help="Model repository.")
    p.add_argument("--workdir", type=Path, default=Path("runs/faults"), help="Servers' workdirs and logs.")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--instances", type=int, default=DEFAULT_INSTANCES)
    p.add_argument("--server-cpus", default=None, help="inflight serve --cpus (e.g. 0-7); default: all.")
    p.add_argument("--client-cpus", default=None, help="Cores for this process (the load), e.g. 8-15.")
    args = p.parse_args(argv)

    def stop(signum: int, _frame: object) -> None:  # the servers are stopped by the with blocks on the way out
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    keys = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = [k for k in keys if k not in FAULTS]
    if unknown:
        p.error(f"unknown fault(s) {unknown}: use {', '.join(FAULTS)}")
    if args.client_cpus:
        from inflight.loadtest.openloop import parse_cpus

        os.sched_setaffinity(0, parse_cpus(args.client_cpus))
    from inflight.build import ensure_built

    ensure_built(args.repository, [args.model.rsplit("_", 1)[0]])
    load_s = dict(DEFAULT_LOAD_S)
    if args.load_s is not None:
        load_s.update(a=args.load_s, b=args.load_s, c=args.load_s)
    load_s["d"] = args.duration_s
    cfg = FaultConfig(
        repository=args.repository.resolve(),
        workdir=args.workdir.resolve(),
        model=args.model,
        instances=args.instances,
        load_s=load_s,
        server_cpus=args.server_cpus,
    )
    path = run_sitting(cfg, args.out, keys, functools.partial(print, flush=True))
    doc = json.loads(path.read_text())
    print(f"wrote {path}")  # noqa: T201 - the command's output
    for line in section_rows(doc):
        print(line)  # noqa: T201
    return 1 if any(f["lost"] for f in doc["faults"]) else 0


def section_rows(doc: Mapping[str, Any]) -> list[str]:
    """One line per fault of a ``faults.json`` document: sent / answered / failed / lost / dropped."""
    return [
        f"({f['fault']}) {f['name']}: sent {f['sent']}, answered {f['answered']}, failed {f['failed']}, "
        f"lost {f['lost']}, dropped {f['dropped']}; recovered {fmt((f.get('recovery') or {}).get('recovered'))}"
        for f in doc.get("faults") or []
    ]


if __name__ == "__main__":
    sys.exit(main())
