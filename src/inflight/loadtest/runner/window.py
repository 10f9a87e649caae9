"""One measured window of an A/B run: the load generator's run, the servers' statistics and CPU, the figures.

:class:`WindowMeter` measures a window (at an offered rate when open loop) and turns what the
generator wrote and what the servers said into the window's record; the module's functions read
the asyncio generator's summary and the open-loop figures of a record.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inflight.loadtest import cpu, gpu_util, rategen
from inflight.loadtest import openloop as ol
from inflight.loadtest import stats as st
from inflight.loadtest.prometheus import means_by_label
from inflight.loadtest.runner.config import LOGGER_NAME, AbConfig, Endpoints, Variant
from inflight.loadtest.runner.fleet import ServerFleet
from inflight.loadtest.runner.metrics import joined, per_server_requests, scrape, sum_counts
from inflight.loadtest.runner.plan import LOCUST_OVERHEAD_S, LoadPlan, LocustRun, run_locust
from inflight.server import control

LOGGER = logging.getLogger(LOGGER_NAME)


class WindowMeter:
    """Measures the windows of a run against its fleet, as its plan sends the load.

    Attributes:
        config: The run's configuration.
        plan: The load plan.
        fleet: The servers.
        data: The run's data folder (generator logs, statistics, raw latencies).
        t0: ``time.monotonic()`` when the first variant started (for the progress lines).
        planned_total: Seconds the whole run is expected to take (updated as it goes).
    """

    def __init__(self, config: AbConfig, plan: LoadPlan, fleet: ServerFleet, data: Path) -> None:
        """Measure with ``plan`` against ``fleet``, writing into ``data``."""
        self.config = config
        self.plan = plan
        self.fleet = fleet
        self.data = data
        self.t0 = 0.0
        self.planned_total = 0.0

    def measure(
        self,
        v: Variant,
        tag: str,
        index: int,
        total: int,
        endpoints: Sequence[Endpoints],
        pool: Path,
        rate: float | None,
    ) -> dict[str, Any]:
        """One measured Locust run (at ``rate`` req/s when open loop) with its statistics and CPU figures.

        With one server per GPU, Triton's statistics are summed over the servers (each server's share
        of the successful requests goes to ``per_server_requests``), and so are the metrics' counters;
        the load goes where the variant's route says (:meth:`ServerFleet.targets`), and with a balancer
        its own CPU in the window goes to ``balancer_cpu``.
        """
        s = self.config.shape if rate is None else self.config.shape.replace(rate=rate)
        problems: list[str] = []
        record: dict[str, Any] = {}
        if rate is not None:
            record["rate"] = rate
        befores = [control.inference_stats(e.http, v.name) for e in endpoints]
        before = st.sum_model_stats(befores)
        steps = v.ensemble.step_models() if v.ensemble is not None else []
        steps_before = _step_stats(endpoints, steps)
        cpu_before = self.fleet.cpu_snapshot()
        front_before = self.fleet.front.snapshot() if self.fleet.front is not None else None
        prefix = self.data / tag
        raw_dir = self.data / f"{tag}-raw"
        samples: list[dict[str, Any]] = []
        window = s.window_s + s.ramp_s
        started = time.monotonic()
        what = f"{v.name} at {rate:,.0f} req/s offered" if rate is not None else v.name

        def tick(elapsed: float) -> None:
            sample = _gauge_sample(elapsed, [scrape(e.metrics) for e in endpoints], v.config.model_name)
            if sample is not None:
                samples.append(sample)
            rps = st.current_rps(Path(f"{prefix}_stats_history.csv"))
            overall_left = self.planned_total - (time.monotonic() - self.t0)
            LOGGER.info(
                "[%d/%d %s %s] %s, %s; about %s left in all",
                index + 1,
                total,
                v.label,
                what,
                progress_time(elapsed, s.window_s, s.ramp_s),
                (
                    "no live rate (the asyncio generator reports at the end)"
                    if self.config.generator == "asyncio" and self.plan.open_loop
                    else "warming up (no sample yet)"
                )
                if rps is None
                else f"{rps:,.0f} req/s now",
                _fmt_s(overall_left),
            )

        started_wall = time.time()
        with gpu_util.UtilizationSampler() as util:  # each GPU's own utilization (nothing without nvidia-smi)
            res = run_locust(
                self.plan.command(
                    v, s, self.fleet.targets(v, endpoints), pool, window, csv_prefix=prefix, raw_dir=raw_dir
                ),
                log=self.data / f"{tag}.log",
                planned_s=window,
                tick=tick,
                tick_interval_s=self.config.progress_interval_s,
            )
        # the measured window only: an H100 sitting (2026-11-28) kept ~3 s of the idle stop in every window's mean
        util_by_gpu = util.result(since=started_wall + s.ramp_s, until=started_wall + s.ramp_s + s.window_s)
        if util_by_gpu is not None:  # keys: the GPUs' physical indices
            record["gpu_util"] = {"source": gpu_util.SOURCE, "by_gpu": util_by_gpu}
        cpu_after = self.fleet.cpu_snapshot()
        front_after = self.fleet.front.snapshot() if self.fleet.front is not None else None
        afters = [control.inference_stats(e.http, v.name) for e in endpoints]
        after = st.sum_model_stats(afters)
        if steps:
            record["steps"] = _step_figures(steps_before, _step_stats(endpoints, steps))
        if len(endpoints) > 1:
            record["per_server_requests"] = per_server_requests(befores, afters)
        texts = [scrape(e.metrics) for e in endpoints]
        sample = _gauge_sample(time.monotonic() - started, texts, v.config.model_name)
        if sample is not None:
            samples.append(sample)
        if all(t is not None for t in texts):
            # Locust has stopped: every request it sent should have left Triton's queue by now. The counters are
            # read per server and summed (one server's series must not be merged with another's)
            record["requests_after_window"] = sum_counts([st.request_state(t, v.name) for t in texts if t is not None])
        if rate is not None:
            record["stub_memory"] = cpu.stub_memory(self.fleet.pids)
            record["gpu_memory"] = cpu.gpu_memory(self.fleet.pids)
            record["generator"] = generator_counts(raw_dir)
            # requests the generator gave up on at the end may still be queued or running in the server:
            # the next window must not start behind them
            record["drain_s"] = self.fleet.drain(endpoints, v)
        record.update(self._figures(res, before, after, prefix, raw_dir, samples, problems))
        requests = (record.get("server") or {}).get("requests")
        record["cpu"] = cpu.window(cpu_before[0], cpu_after[0], requests)
        if cpu_before[1] is not None and cpu_after[1] is not None:
            record["cpu"]["client_busy"] = cpu.window(cpu_before[1], cpu_after[1], None)["host_busy"]
        if self.fleet.front is not None:
            record["balancer_cpu"] = self.fleet.front.window(front_before, front_after, requests)
        point = rate_point(record) if rate is not None else None
        if point is not None:
            record["slo_misses"] = ol.slo_failures(point, self.config.slo_ms)
            record["generator_limited"] = generator_limited(record)
        locust, lat, server = record.get("locust"), record.get("latency_ms") or {}, record.get("server") or {}
        LOGGER.info(
            "%s %s: %s req/s%s, p50 %s ms, p99 %s ms, %s failures, avg batch %s requests taking %s us in execute() "
            "(Triton's compute_infer: the whole batch a request rode in), server cores busy %s, server CPU %s cores "
            "= %s us/request%s%s",
            tag,
            what,
            f"{locust['rps']:,.0f}" if locust else "?",
            ""
            if point is None
            else f" answered ({point.achieved_rps:,.0f} req/s achieved in the window, "
            f"{100 * point.achieved_rps / point.offered_rps:.0f}% of offered)",
            _num(lat.get("p50")),
            _num(lat.get("p99")),
            locust["failures"] if locust else "?",
            _num(server.get("avg_batch_requests")),
            _num(server.get("compute_infer_us")),
            f"{100 * record['cpu']['host_busy']:.0f}%" if math.isfinite(record["cpu"]["host_busy"]) else "?",
            _num(record["cpu"]["server_cores"]),
            _num(record["cpu"]["server_us_per_request"]),
            ""
            if rate is None
            else (" (SLO: met)" if not record["slo_misses"] else f" (SLO missed: {'; '.join(record['slo_misses'])})"),
            ("" if record["valid"] else " (INVALID: " + "; ".join(record["problems"]) + ")")
            + ("" if not record["caveats"] else " (CAVEAT: " + "; ".join(record["caveats"]) + ")"),
        )
        if steps:
            LOGGER.info("%s %s: the ensemble's steps per request: %s", tag, what, _steps_line(record["steps"]))
        return record

    def _figures(
        self,
        res: LocustRun,
        before: dict[str, Any],
        after: dict[str, Any],
        prefix: Path,
        raw_dir: Path,
        samples: list[dict[str, Any]],
        problems: list[str],
    ) -> dict[str, Any]:
        """The window's figures from the generator's files and Triton's statistics; ``problems`` gets what failed."""
        out: dict[str, Any] = {"locust_log": str(res.log), "locust_returncode": res.returncode}
        if res.killed:
            problems.append(f"Locust overran its window and was killed (log: {res.log})")
        elif res.returncode not in (0, 1):  # 1 = some requests failed, counted below
            problems.append(f"Locust exited with {res.returncode} (log: {res.log}):\n{_tail(res.log)}")
        # A busy client does not make the figures wrong, it makes them a lower bound of what the server
        # can do: kept (and used), but flagged on the run, the variant and the report.
        caveats = []
        if res.cpu_warnings:
            caveats.append(
                "client-limited: the load generator's CPU was above 90% at some point, so the generator, not the "
                f"server, may have limited the figures (read them as a lower bound for the server): "
                f"{res.cpu_warnings[0]!r}; give the generator cores of its own or more --processes"
            )
        out["cpu_warnings"] = res.cpu_warnings
        out["client_limited"] = bool(res.cpu_warnings)
        out["caveats"] = caveats
        try:
            lat = st.read_raw_latencies(raw_dir)
        except st.StatsError as e:
            problems.append(str(e))
            lat = np.empty(0)
        out["latency_ms"] = st.latency_summary(lat)
        if self.plan.open_loop and self.config.generator == "asyncio":
            out.update(rategen_figures(raw_dir, out["latency_ms"], problems))
        else:
            try:
                out["locust"] = st.read_locust_stats(Path(f"{prefix}_stats.csv"))
            except st.StatsError as e:
                problems.append(str(e))
                out["locust"] = None
            out["failure_messages"] = st.read_locust_failures(Path(f"{prefix}_failures.csv"))
            out["failures_by_status"] = st.read_locust_failures_by_status(Path(f"{prefix}_failures.csv"))
            out["history"] = st.read_locust_history(Path(f"{prefix}_stats_history.csv"))
        out["_latencies"] = lat  # pooled per variant by _document, not written
        if not self.config.keep_raw:
            shutil.rmtree(raw_dir, ignore_errors=True)
        out["stats_before"], out["stats_after"] = before, after
        try:
            out["server"] = st.stats_delta(before, after).to_dict()
        except st.StatsError as e:
            problems.append(str(e))
            out["server"] = None
        out["gpu_samples"] = samples
        out["gpu_activity"] = st.summarize_gauge([x.get("gpu_activity") for x in samples])
        gpus = sorted({k for x in samples for k in x.get("gpu_activity_by_gpu", {})})
        if gpus:  # each GPU's own activity (issue 54: every GPU busy, not only their mean)
            out["gpu_activity_by_gpu"] = {
                k: st.summarize_gauge([x.get("gpu_activity_by_gpu", {}).get(k) for x in samples]) for k in gpus
            }
        out["sync_share"] = st.summarize_gauge([x.get("sync_share") for x in samples])
        locust = out["locust"]
        if locust is not None and locust["requests"] - locust["failures"] <= 0:
            problems.append("no request succeeded in the window")
        out["problems"] = problems
        out["valid"] = not problems
        return out


def _step_stats(endpoints: Sequence[Endpoints], models: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Triton's statistics of each of ``models``, summed over the servers."""
    return {m: st.sum_model_stats([control.inference_stats(e.http, m) for e in endpoints]) for m in models}


def _step_figures(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """Each ensemble step's window (Triton's statistics of that model), or why it has none."""
    out: dict[str, Any] = {}
    for model, b in before.items():
        try:
            out[model] = st.stats_delta(b, after[model]).to_dict()
        except st.StatsError as e:
            out[model] = {"error": str(e)}
    return out


def _steps_line(steps: Mapping[str, Any]) -> str:
    """``model: queue Q us, compute C us, B requests a batch`` for each step, in the ensemble's order."""
    return "; ".join(
        f"{m}: {s['error']}"
        if "error" in s
        else f"{m}: queue {_num(s['queue_us'])} us, compute {_num(s['compute_infer_us'])} us, "
        f"{_num(s['avg_batch_requests'])} requests a batch"
        for m, s in steps.items()
    )


def _num(x: object) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) and math.isfinite(x) else "?"


def _fmt_s(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def progress_time(elapsed_s: float, window_s: float, ramp_s: float, startup_s: float = LOCUST_OVERHEAD_S) -> str:
    """How far a Locust run is: seconds since it was started against what it should take in all.

    The run takes Locust's own start-up (about ``startup_s``), the ramp-up and the measured window,
    so the elapsed time is shown against their sum, each part named, and an overrun said as one.
    """
    planned = startup_s + ramp_s + window_s
    parts = f"Locust start-up ~{_fmt_s(startup_s)}, ramp-up {_fmt_s(ramp_s)}, window {_fmt_s(window_s)}"
    if elapsed_s <= planned:
        return f"{_fmt_s(elapsed_s)} of about {_fmt_s(planned)} ({parts})"
    return f"{_fmt_s(elapsed_s)}, past the planned {_fmt_s(planned)} ({parts}): waiting for Locust to finish"


def rate_point(record: Mapping[str, Any]) -> ol.RatePoint:
    """The open-loop figures of one window record (``rate`` set) as a :class:`~inflight.loadtest.openloop.RatePoint`."""
    locust = record.get("locust") or {}
    lat = record.get("latency_ms") or {}
    gen = record.get("generator") or {}
    requests = int(locust.get("requests", 0))
    failures = int(locust.get("failures", 0))
    rps = float(locust.get("rps", math.nan))
    # the generator's own count: successful answers inside the window, per second of it (Locust's rate
    # counts failures too and ends at its last answer)
    achieved = float(gen.get("achieved_rps", math.nan))
    if not math.isfinite(achieved):
        achieved = rps * (requests - failures) / requests if requests else 0.0
    return ol.RatePoint(
        offered_rps=float(record["rate"]),
        achieved_rps=achieved,
        requests=requests,
        failures=failures,
        p50_ms=float(lat.get("p50", math.nan)),
        p95_ms=float(lat.get("p95", math.nan)),
        p99_ms=float(lat.get("p99", math.nan)),
        late_fraction=float(gen.get("late_fraction", math.nan)),
        answered_fraction=float(gen.get("answered_fraction", math.nan)),
        valid=bool(record.get("valid", False)),
    )


def rategen_figures(raw_dir: Path, latency: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    """The asyncio generator's summary as the record's counts (the ``locust`` block's keys) and its own figures."""
    path = raw_dir / rategen.SUMMARY_NAME
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        problems.append(f"the asyncio generator wrote no summary ({e}); see its log")
        return {
            "locust": None,
            "failure_messages": [],
            "failures_by_status": {},
            "history": [],
            "generator_run": None,
        }
    if summary.get("errors"):
        problems.append("the asyncio generator: " + "; ".join(summary["errors"]))
    counts = {
        "requests": int(summary["requests"]),
        "failures": int(summary["failures"]),
        "rps": float(summary["rps"]),
        "failures_per_s": float(summary["failures_per_s"]),
        "avg_ms": float(latency.get("mean", math.nan)),
        "p50_ms": float(latency.get("p50", math.nan)),
        "p95_ms": float(latency.get("p95", math.nan)),
        "p99_ms": float(latency.get("p99", math.nan)),
        "max_ms": float(latency.get("max", math.nan)),
    }
    keys = (
        "sources",
        "cpu_s",
        "us_per_request",
        "busy_max",
        "peak_connections",
        "connection_waits",
        "stalls",
        "generator_gc",
    )
    own = {k: summary.get(k) for k in keys}
    if len(summary.get("per_url") or {}) > 1:
        own["per_url"] = summary["per_url"]  # several servers: what each one's sources sent and got answered
    return {
        "locust": counts,
        "failure_messages": summary.get("failure_messages", []),
        "failures_by_status": summary.get("failures_by_status", {}),
        "history": [],
        "generator_run": {"tool": summary.get("generator"), **own},
    }


def generator_counts(raw_dir: Path) -> dict[str, Any]:
    """The open-loop sources' send counts (``openloop-*.json`` of every Locust process), summed."""
    parts: list[dict[str, Any]] = []
    for path in sorted(raw_dir.glob("openloop-*.json")):
        with contextlib.suppress(OSError, ValueError):
            parts.extend(json.loads(path.read_text()))
    return ol.Lateness.combine(parts) if parts else {"sources": 0}


def generator_limited(record: Mapping[str, Any]) -> bool:
    """True when the generator did not keep its schedule: too many very late sends, or Locust's CPU warning."""
    gen = record.get("generator") or {}
    late = gen.get("very_late_fraction")
    return bool(record.get("client_limited")) or (
        isinstance(late, float) and math.isfinite(late) and late > ol.MAX_LATE_FRACTION
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _gauge_sample(elapsed_s: float, texts: Sequence[str | None], model: str) -> dict[str, Any] | None:
    """The GPU gauges ``elapsed_s`` into a window, from each server's metrics text (None when none could be read).

    The gauges are means over instances, every server's instances together, and each GPU's own (:func:`_by_gpu`).
    """
    text = joined(texts)
    if text is None:
        return None
    return {"t": round(elapsed_s, 1), **st.gpu_gauges(text, model), **_by_gpu(texts, model)}


def _by_gpu(texts: Sequence[str | None], model: str) -> dict[str, Any]:
    """``{"gpu_activity_by_gpu": {"<server>:<gpu>": activity}}`` from each server's metrics (empty without gauges).

    The key is the server's index among the run's servers and the GPU its instances report (the metric's
    ``gpu`` label, as that server's process numbers its visible GPUs).
    """
    by: dict[str, float] = {}
    for i, text in enumerate(texts):
        if text is not None:
            for gpu, value in means_by_label(text, st.GPU_GAUGES["gpu_activity"], model, "gpu").items():
                by[f"{i}:{gpu}"] = value
    return {"gpu_activity_by_gpu": by} if by else {}
