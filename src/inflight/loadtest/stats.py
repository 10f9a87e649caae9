"""Figures of one load-test window, as pure functions of what the server and Locust wrote.

* Server side: the difference of two ``/v2/models/<m>/stats`` snapshots (cumulative counters, as
  perf_analyzer does it) gives per-request queue / compute_input / compute_infer / compute_output
  times, executions, requests and the average batch size in items.
* Client side: Locust rounds response times (to whole ms below 100 ms, and coarser above) before
  it computes percentiles, so exact p50/p95/p99 come from the raw per-request latencies that
  every Locust process writes (``--raw-latency-dir``).
* Locust's CSV files (``_stats.csv``, ``_stats_history.csv``, ``_failures.csv``), its CPU
  warning, and the backend's gauges at the Prometheus metrics endpoint.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inflight.loadtest.executor_stats import (
    _loads,
    _mean_breakdown,
    config_instances,
    executor_breakdown,
    executor_stats_from_log,
)
from inflight.loadtest.prometheus import metric_samples, metric_values
from inflight.tool_errors import StatsError

#: Percentiles reported everywhere.
PERCENTILES: tuple[float, ...] = (50.0, 95.0, 99.0)

#: Points of the latency percentile curve stored in the JSON (for the plot).
CURVE: tuple[float, ...] = (0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 98.0, 99.0, 99.5, 99.9, 99.99, 100.0)

_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True, kw_only=True)
class ServerBreakdown:
    """What the server did during a window (difference of two statistics snapshots).

    Times are microseconds per successful request, averaged over the window. In pipelined mode
    ``compute_infer`` ends when ``execute()`` returns, before the responses are sent.

    Attributes:
        requests: Successful requests.
        failures: Failed requests.
        inferences: Items inferred (``inference_count``).
        executions: Model executions (batches, ``execution_count``).
        avg_batch_items: Items per execution (``inferences / executions``).
        avg_batch_requests: Requests per execution.
        request_us: Whole request inside the server (``success``).
        queue_us: Waiting in the scheduler queue.
        compute_input_us: Input handling before execute.
        compute_infer_us: execute().
        compute_output_us: Output handling after execute.
    """

    requests: int
    failures: int
    inferences: int
    executions: int
    avg_batch_items: float
    avg_batch_requests: float
    request_us: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON)."""
        return asdict(self)


def _counter(snapshot: Mapping[str, Any], *path: str) -> int:
    node: Any = snapshot
    for key in path:
        if not isinstance(node, Mapping):
            return 0
        node = node.get(key, 0)
    return int(node or 0)


def stats_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> ServerBreakdown:
    """The window between two ``model_stats`` entries of the same model.

    Args:
        before: ``model_stats[0]`` of ``GET /v2/models/<m>/stats`` at the start of the window.
        after: The same at the end.

    Raises:
        StatsError: when the snapshots belong to different models or a counter went backwards
            (the model was reloaded during the window: run again without reloading it).
    """
    if before.get("name") != after.get("name"):
        raise StatsError(
            f"statistics of different models: {before.get('name')!r} then {after.get('name')!r}; snapshot the "
            "same model before and after the window"
        )

    def d(*path: str) -> int:
        v = _counter(after, *path) - _counter(before, *path)
        if v < 0:
            raise StatsError(
                f"{after.get('name')}: counter {'.'.join(path)} went backwards ({_counter(before, *path)} -> "
                f"{_counter(after, *path)}); the model was reloaded during the window, run it again"
            )
        return v

    ok = d("inference_stats", "success", "count")
    per_request: dict[str, float] = {}
    for phase in ("success", *_PHASES):
        ns, n = d("inference_stats", phase, "ns"), d("inference_stats", phase, "count")
        per_request[phase] = ns / n / 1e3 if n else math.nan
    inferences = d("inference_count")
    executions = d("execution_count")
    return ServerBreakdown(
        requests=ok,
        failures=d("inference_stats", "fail", "count"),
        inferences=inferences,
        executions=executions,
        avg_batch_items=inferences / executions if executions else math.nan,
        avg_batch_requests=ok / executions if executions else math.nan,
        request_us=per_request["success"],
        queue_us=per_request["queue"],
        compute_input_us=per_request["compute_input"],
        compute_infer_us=per_request["compute_infer"],
        compute_output_us=per_request["compute_output"],
    )


def sum_model_stats(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One model's ``model_stats`` entries from several servers (one per GPU) summed into one entry.

    Every counter of the entry is a count or a cumulative time in ns, so the servers' entries add
    field by field: ``inference_count``, ``execution_count``, each phase's ``count`` and ``ns`` in
    ``inference_stats``, ``response_stats``, and ``batch_stats`` matched by ``batch_size``;
    ``last_inference`` (a timestamp) takes the latest. What identifies the counters (``name``,
    ``version``, each ``batch_size``) is the first entry's. :func:`stats_delta` of two sums is then
    the sum of the servers' windows, with times per request weighted by each server's requests.

    Raises:
        StatsError: for no entries, or entries of different models.
    """
    if not entries:
        raise StatsError("no statistics to sum; snapshot at least one server")
    names = sorted({str(e.get("name")) for e in entries})
    if len(names) > 1:
        raise StatsError(f"statistics of different models ({', '.join(names)}) cannot be summed; snapshot one model")
    if len(entries) == 1:
        return dict(entries[0])
    merged = _sum_stats(list(entries), "")
    assert isinstance(merged, dict)
    return merged


def _sum_stats(values: list[Any], key: str) -> Any:
    """Sum several servers' values of one field of a ``model_stats`` entry (see :func:`sum_model_stats`)."""
    first = values[0]
    if all(isinstance(v, Mapping) for v in values):
        keys = list(dict.fromkeys(k for v in values for k in v))
        return {k: _sum_stats([v[k] for v in values if k in v], k) for k in keys}
    if key == "batch_stats" and all(isinstance(v, list) for v in values):
        by_size: dict[int, list[Any]] = {}
        for v in values:
            for entry in v:
                by_size.setdefault(int(entry.get("batch_size", 0)), []).append(entry)
        return [_sum_stats(group, "") for _, group in sorted(by_size.items())]
    if key in _STATS_KEYS:
        return first
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return max(values) if key == "last_inference" else sum(values)
    return first


#: Fields of a ``model_stats`` entry that identify what the counters count: never summed.
_STATS_KEYS = frozenset({"name", "version", "batch_size"})


def sum_breakdowns(parts: Sequence[ServerBreakdown]) -> ServerBreakdown:
    """Combine windows (repeats of one variant): counts add, times are request-weighted means."""
    if not parts:
        raise StatsError("no windows to combine")
    req = sum(p.requests for p in parts)
    inf = sum(p.inferences for p in parts)
    ex = sum(p.executions for p in parts)

    def mean(attr: str) -> float:
        pairs = [(getattr(p, attr), p.requests) for p in parts if p.requests and not math.isnan(getattr(p, attr))]
        n = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / n if n else math.nan

    return ServerBreakdown(
        requests=req,
        failures=sum(p.failures for p in parts),
        inferences=inf,
        executions=ex,
        avg_batch_items=inf / ex if ex else math.nan,
        avg_batch_requests=req / ex if ex else math.nan,
        request_us=mean("request_us"),
        queue_us=mean("queue_us"),
        compute_input_us=mean("compute_input_us"),
        compute_infer_us=mean("compute_infer_us"),
        compute_output_us=mean("compute_output_us"),
    )


def exact_percentiles(latencies_ms: np.ndarray, qs: Iterable[float] = PERCENTILES) -> dict[str, float]:
    """Nearest-rank percentiles: the smallest observed latency with at least q% of requests at or below it.

    Returns:
        ``{"p50": ..., "p95": ..., ...}`` in milliseconds (NaN for no data).
    """
    a = np.asarray(latencies_ms, dtype=np.float64)
    out: dict[str, float] = {}
    for q in qs:
        key = f"p{q:g}"
        out[key] = float(np.quantile(a, q / 100.0, method="inverted_cdf")) if a.size else math.nan
    return out


def latency_summary(latencies_ms: np.ndarray) -> dict[str, Any]:
    """Count, mean, min, max, exact p50/p95/p99, and the percentile curve (``CURVE``)."""
    a = np.asarray(latencies_ms, dtype=np.float64)
    summary: dict[str, Any] = {"count": int(a.size)}
    if a.size:
        summary.update(mean=float(a.mean()), min=float(a.min()), max=float(a.max()))
    else:
        summary.update(mean=math.nan, min=math.nan, max=math.nan)
    summary.update(exact_percentiles(a))
    summary["curve"] = {f"{q:g}": v for q, v in zip(CURVE, exact_percentiles(a, CURVE).values(), strict=True)}
    return summary


def read_raw_latencies(directory: Path) -> np.ndarray:
    """Concatenate the ``latencies-*.f64`` files the Locust processes wrote (float64 ms).

    Raises:
        StatsError: when the folder holds none (run Locust with ``--raw-latency-dir``).
    """
    files = sorted(Path(directory).glob("latencies-*.f64"))
    if not files:
        raise StatsError(
            f"no raw latency files in {directory}; the Locust processes write them at test stop when started "
            "with --raw-latency-dir"
        )
    return np.concatenate([np.fromfile(f, dtype="<f8") for f in files])


#: Lines by which Locust says its own CPU limited the test (worker, master and end-of-test forms).
CPU_WARNING = re.compile(
    r"CPU usage above \d+%|exceeded cpu threshold|CPU usage threshold was exceeded|CPU usage was too high"
)


def cpu_warnings(log_text: str) -> list[str]:
    """The lines of a Locust log that report its CPU above the threshold (90%); empty when none."""
    return [line.strip() for line in log_text.splitlines() if CPU_WARNING.search(line)]


def _num(value: str | None) -> float:
    if value is None or value in ("", "N/A"):
        return math.nan
    return float(value)


def read_locust_stats(path: Path) -> dict[str, float]:
    """The ``Aggregated`` row of Locust's ``<prefix>_stats.csv``: requests, failures, req/s, its percentiles.

    Raises:
        StatsError: when the file or the row is missing.
    """
    try:
        with Path(path).open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise StatsError(f"Locust wrote no statistics ({e}); see its log for why it stopped") from None
    for row in rows:
        if row.get("Name") == "Aggregated":
            return {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "rps": _num(row["Requests/s"]),
                "failures_per_s": _num(row["Failures/s"]),
                "avg_ms": _num(row["Average Response Time"]),
                "p50_ms": _num(row.get("50%")),
                "p95_ms": _num(row.get("95%")),
                "p99_ms": _num(row.get("99%")),
                "max_ms": _num(row["Max Response Time"]),
            }
    raise StatsError(f"{path} has no Aggregated row")


#: Seconds over which ``read_locust_history`` derives throughput from the request count. Workers
#: report to the master every 3 s, so shorter spans alternate between too little and too much.
COUNT_SPAN_S = 6.0


def read_locust_history(path: Path, span_s: float = COUNT_SPAN_S) -> list[dict[str, float]]:
    """``<prefix>_stats_history.csv`` (Aggregated rows), one dict per row (about one a second).

    Keys: ``t`` (seconds since the first row), ``users``, ``rps`` and ``failures_per_s`` as Locust
    wrote them (its current rate, which lags and steps with the workers' 3 s reports),
    ``total_requests``, and ``rps_counted``: the growth of the request count over the last
    ``span_s`` seconds (restarting where Locust reset its statistics), which the plots use.
    """
    try:
        with Path(path).open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("Name") == "Aggregated"]
    except OSError:
        return []
    if not rows:
        return []
    t0 = float(rows[0]["Timestamp"])
    out: list[dict[str, float]] = [
        {
            "t": float(r["Timestamp"]) - t0,
            "users": int(r["User Count"]),
            "rps": _num(r["Requests/s"]),
            "failures_per_s": _num(r["Failures/s"]),
            "total_requests": int(r["Total Request Count"]),
        }
        for r in rows
    ]
    segment = 0
    for i, row in enumerate(out):
        if i and row["total_requests"] < out[i - 1]["total_requests"]:
            segment = i  # statistics were reset here
        j = segment
        while j < i and out[j]["t"] < row["t"] - span_s:
            j += 1
        dt = row["t"] - out[j]["t"]
        row["rps_counted"] = (row["total_requests"] - out[j]["total_requests"]) / dt if dt > 0 else math.nan
    return out


def current_rps(path: Path) -> float | None:
    """Req/s over the last seconds of a stats history being written (progress lines); None before data."""
    history = read_locust_history(path)
    if not history or math.isnan(history[-1]["rps_counted"]):
        return None
    return history[-1]["rps_counted"]


def read_locust_failures(path: Path, limit: int = 5) -> list[dict[str, Any]]:
    """The most frequent failure messages of ``<prefix>_failures.csv``."""
    try:
        with Path(path).open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return []
    rows.sort(key=lambda r: -int(r.get("Occurrences") or 0))
    return [{"error": _unwrap(r.get("Error", "")), "occurrences": int(r.get("Occurrences") or 0)} for r in rows[:limit]]


def read_locust_failures_by_status(path: Path) -> dict[str, int]:
    """Every failure of ``<prefix>_failures.csv`` counted per HTTP status (gRPC code, or ``other``)."""
    from inflight.loadtest.checks import failures_by_status

    try:
        with Path(path).open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return {}
    return failures_by_status((_unwrap(r.get("Error", "")), int(r.get("Occurrences") or 0)) for r in rows)


_WRAPPED = re.compile(r"^\w+\((?P<q>['\"])(?P<msg>.*)(?P=q)\)$", re.DOTALL)


def _unwrap(error: str) -> str:
    """``CatchResponseError("HTTP 404: ...")`` → ``HTTP 404: ...`` (Locust writes the exception's repr)."""
    m = _WRAPPED.match(error.strip())
    return m.group("msg") if m else error


#: The backend's live GPU gauges (published only with the model parameter cupti=true).
GPU_GAUGES: dict[str, str] = {"gpu_activity": "inflight_gpu_activity", "sync_share": "inflight_sync_share"}


def gpu_gauges(text: str, model: str | None) -> dict[str, float | None]:
    """Mean over instances of each GPU gauge for ``model`` (every model when None); None where absent."""
    out: dict[str, float | None] = {}
    for key, metric in GPU_GAUGES.items():
        values = metric_values(text, metric, model)
        out[key] = float(np.mean(values)) if values else None
    return out


def summarize_gauge(samples: Sequence[float | None]) -> dict[str, Any] | str:
    """Mean/min/max of gauge samples taken during a window, or ``"not available"``."""
    values = [v for v in samples if v is not None]
    if not values:
        return "not available"
    return {"mean": float(np.mean(values)), "min": float(min(values)), "max": float(max(values)), "n": len(values)}


def attach_executor_stats(doc: dict[str, Any], log_text: str | Sequence[str]) -> int:
    """Give each run of an A/B document its instances' ``finalized`` records from the server log(s).

    Each run loads its variant, runs the load and unloads it, so the records of a model name
    appear in run order, one per instance. With one server per GPU, pass each server's log as its
    own text: every server loads every variant, so its log holds a run's records for that server's
    instances, and a run takes its instances' records from each log (the logs must not be joined
    into one text: the first server's records of every run would come before the second's, and
    a run would take the records of the next run on the same server instead of its other server's).

    Runs that one load served (the rates of a fixed-rate round, the steps of a search: consecutive runs of one
    variant and round with the same ``load_s``) take that load's records together and share the breakdown
    (the counters cover the load's whole life); the variant's summary takes each load once.

    Returns:
        Runs that got a breakdown.
    """
    texts = [log_text] if isinstance(log_text, str) else list(log_text)
    logs = [executor_stats_from_log(t) for t in texts]
    # instances per variant and server, from the config it was loaded with (overrides already applied)
    instances = {v["label"]: config_instances(v.get("config", {})) for v in doc.get("variants", [])}
    # the model whose instances log the records: the variant's own, or an ensemble's encoder step
    served = {v["label"]: v.get("config", {}).get("name") for v in doc.get("variants", [])}
    got = 0
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for load in _loads(doc.get("runs", [])):
        first = load[0]
        n = instances.get(first["variant"], 1)
        name = served.get(first["variant"]) or first["model_name"]
        taken = []
        for records in logs:
            mine = []
            for i, r in enumerate(records):
                if r["model"] == name:
                    mine.append(i)
                    if len(mine) == n:
                        break
            taken += [records[i] for i in mine]
            for i in reversed(mine):
                records.pop(i)
        breakdown = executor_breakdown(taken) if taken else None
        for run in load:
            run["executor"] = breakdown
            got += breakdown is not None
        if breakdown is not None:
            by_variant.setdefault(first["variant"], []).append(breakdown)
    for s in doc.get("summary", []):
        runs = by_variant.get(s["variant"], [])
        s["executor"] = runs[-1] if len(runs) == 1 else (_mean_breakdown(runs) if runs else None)
    return got


#: Triton's per-model request counters (Prometheus names) and the keys :func:`request_state` gives them.
REQUEST_METRICS: dict[str, str] = {
    "pending": "nv_inference_pending_request_count",
    "success": "nv_inference_request_success",
    "failure": "nv_inference_request_failure",
    "executions": "nv_inference_exec_count",
}


def request_state(metrics_text: str, model: str) -> dict[str, Any]:
    """Where ``model``'s requests are, from one scrape of Triton's metrics endpoint.

    ``pending`` is Triton's own count of requests accepted by the core and not yet handed to an
    instance (its scheduler queue): when a model will not unload, a non-zero ``pending`` places the
    stuck requests in Triton's scheduler, zero places them outside it (the HTTP frontend, or inside
    an instance that never answered). The counters are summed over the model's versions (and
    failure reasons); a series Triton publishes both with and without ``gpu_uuid`` counts once.

    Returns:
        ``{"pending": n, "success": n, "failure": n, "executions": n}``, a key set to None where the
        server does not publish that metric, plus ``lines``: the model's raw sample lines.
    """
    out: dict[str, Any] = {}
    for key, metric in REQUEST_METRICS.items():
        # Triton 2.51 publishes some counters twice, with and without a gpu_uuid label: one per series
        series: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in metric_samples(metrics_text, metric, model):
            k = tuple(sorted((n, v) for n, v in labels.items() if n != "gpu_uuid"))
            series[k] = max(series.get(k, value), value)
        out[key] = int(sum(series.values())) if series else None
    out["lines"] = [
        ln
        for ln in metrics_text.splitlines()
        if ln.startswith(tuple(REQUEST_METRICS.values())) and f'model="{model}"' in ln
    ]
    return out
