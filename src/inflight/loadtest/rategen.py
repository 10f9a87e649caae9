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
(:class:`~inflight.loadtest.rategen_sources._GrpcSource`): the ``ModelInferRequest`` messages of
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
import gc
import json
import logging
import math
import multiprocessing as mp
import os
import queue
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from inflight.errors import ConfigError
from inflight.loadtest import checks, schedule
from inflight.loadtest import openloop as ol
from inflight.loadtest import workload as wl
from inflight.loadtest.rategen_answers import answer_checker, grpc_answer_checker, stall_summary
from inflight.loadtest.rategen_options import (
    PROTOCOLS,
    GenOptions,
    build_grpc_requests,
    build_requests,
    parse_url,
    parse_urls,
    source_url,
)
from inflight.loadtest.rategen_sources import _GrpcSource, _serve_source, _Source

LOGGER = logging.getLogger(__name__)

#: File name, in ``raw_dir``, of the summary the runner reads instead of Locust's statistics.
SUMMARY_NAME = "rategen-summary.json"

#: Seconds between the parent's start signal and the first scheduled send (the workers import and connect).
START_DELAY_S = 2.0

#: A worker busier than this fraction of its wall time was CPU-bound: the figures may be the generator's.
BUSY_LIMIT = 0.9


#: The line :func:`main` logs when its run ends; :func:`read_summary_line` reads it back from a load log.
SUMMARY_LINE = (
    "offered %.0f req/s: %d answered (%.0f req/s), %d failures, %.2f%% sent > %.0f ms late, "
    "%d waited for a connection, generator CPU %.1f us/request, busiest source %.0f%%%s"
)
_SUMMARY_FIGURES = re.compile(
    r"offered (?P<offered>[\d.]+) req/s: (?P<answered>\d+) answered \((?P<rps>[\d.]+) req/s\), "
    r"(?P<failures>\d+) failures, (?P<late>[\d.]+|nan)% sent > [\d.]+ ms late"
)


def read_summary_line(text: str) -> dict[str, float] | None:
    """The figures of the last :data:`SUMMARY_LINE` in ``text`` (a load log), or None when it holds none.

    Returns:
        ``{"offered_rps", "answered", "rps", "failures", "very_late_fraction"}``: the rate asked for, the answers
        and their rate, and the share of sends more than ``openloop.LIMIT_LATE_MS`` behind schedule (NaN where
        the run measured none).
    """
    found = list(_SUMMARY_FIGURES.finditer(text))
    if not found:
        return None
    m = found[-1]
    return {
        "offered_rps": float(m["offered"]),
        "answered": float(m["answered"]),
        "rps": float(m["rps"]),
        "failures": float(m["failures"]),
        "very_late_fraction": float(m["late"]) / 100,
    }


def fell_behind(very_late_fraction: float) -> bool:
    """Whether a run's generator fell behind its schedule (``very_late_fraction`` of :func:`read_summary_line`).

    More than ``openloop.MAX_LATE_FRACTION`` of the sends over ``openloop.LIMIT_LATE_MS`` late: the requests waited
    for a connection, so the server was past its capacity and the offered rate was not what it served.
    """
    return very_late_fraction > ol.MAX_LATE_FRACTION


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
        "failures_by_status": checks.failures_by_status(failures.items()),
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
    p.add_argument("--arrival", choices=schedule.ARRIVALS, default="poisson")
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
        SUMMARY_LINE,
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
