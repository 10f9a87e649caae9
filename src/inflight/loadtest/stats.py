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
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inflight.runtime.record import combine
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


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str, metric: str, model: str | None) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each sample of ``metric`` for ``model`` (all models if None) in Prometheus text."""
    out: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        if not line.startswith(metric):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group("name") != metric:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        if model is None or labels.get("model") == model:
            out.append((labels, float(m.group("value"))))
    return out


def metric_values(text: str, metric: str, model: str | None) -> list[float]:
    """Values of ``metric`` for ``model`` (one per instance; all models if None) in Prometheus text, or []."""
    return [value for _, value in metric_samples(text, metric, model)]


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


# -- the executor's own counters (the backend logs them when an instance is finalized) ----------

_FINALIZED = re.compile(r"\] (?P<model>\S+) \((?P<instance>[^)]*)\) finalized \((?P<state>[^)]*)\): (?P<json>\{.*\})")


def executor_stats_from_log(text: str) -> list[dict[str, Any]]:
    """The ``finalized`` records the inflight backend logs at unload, in log order.

    Returns:
        ``[{"model", "instance", "drained", "stats"}]``; lines that do not parse are skipped.
    """
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _FINALIZED.search(line.replace('\\"', '"'))
        if m is None:
            continue
        try:
            stats = json.loads(m.group("json"))
        except json.JSONDecodeError:
            continue
        drained = m.group("state") == "drained"
        out.append({"model": m.group("model"), "instance": m.group("instance"), "drained": drained, "stats": stats})
    return out


#: The steps of one batch whose longest time each instance logs (``<step>_max_s``; ``ExecutorStats``).
_STEPS = ("parse", "gather", "launch", "wait", "build")


def executor_breakdown(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Where one run's execute-thread and response time went, over its instances.

    Per batch (``_ms``) and per response (``_us``) figures, from the backend's cumulative counters
    (warm-up included, as they cover the model's whole life), each combined over the instances as
    its owner declares (``inflight.runtime.record``: summed, the longest, or the mean).

    Returns:
        None when the records carry no batches.
    """
    tot = combine([r["stats"] for r in records])
    depth: dict[str, int] = {}
    for r in records:
        for k, v in (r["stats"].get("depth_launches") or {}).items():
            depth[k] = depth.get(k, 0) + int(v)
    batches = tot.get("batches", 0.0)
    if batches <= 0:
        return None
    executes = max(tot.get("executes", 0.0), 1.0)
    responses = tot.get("responses", 0.0) or tot.get("requests", 0.0)

    def per_batch(key: str) -> float | None:
        return tot[key] / batches * 1e3 if key in tot else None

    return {
        "instances": len(records),
        "batches": int(batches),
        "requests_per_batch": tot.get("requests", 0.0) / batches,
        "execute_ms": tot["execute_s"] / executes * 1e3 if "execute_s" in tot else None,
        "between_executes_ms": tot["between_executes_s"] / executes * 1e3 if "between_executes_s" in tot else None,
        "parse_ms": tot["parse_s"] / executes * 1e3 if "parse_s" in tot else None,
        "gather_ms": per_batch("gather_s"),
        "launch_ms": per_batch("launch_s"),
        "device_wait_ms": per_batch("device_wait_s"),
        "slot_wait_ms": per_batch("slot_wait_s"),
        # what auto's in-band path adds to sync's: taking and returning a slot of the ring (sync: its depth
        # count), per batch; the policy's decision and measurement, per execute (auto only)
        "slot_us": tot["slot_s"] / batches * 1e6 if "slot_s" in tot else None,
        "auto_policy_us": tot["auto_policy_s"] / executes * 1e6 if tot.get("auto_policy_s") else None,
        "respond_ms": per_batch("respond_latency_s"),
        "build_us_per_response": tot["build_s"] / responses * 1e6 if "build_s" in tot and responses else None,
        "send_call_us_per_response": (
            tot["send_call_s"] / tot["responses"] * 1e6 if tot.get("send_call_s") and tot.get("responses") else None
        ),
        "slot_waits": int(tot.get("slot_waits", 0)),
        "backlog_waits": int(tot.get("send_waits", 0)),
        "max_depth": max((int(k) for k in depth), default=0),
        "depth_launches": dict(sorted(depth.items(), key=lambda kv: int(kv[0]))),
        "gil_probe_mean_late_us": (tot.get("gil_probe_mean_late_us")),
        # overlap mode: chunks per batch; auto: the batches of each path and the overlap bound it measured
        "chunks_per_execute": tot["chunks"] / executes if tot.get("chunks") else None,
        "inline_wait_ms": tot["inline_wait_s"] / executes * 1e3 if tot.get("chunks") else None,
        "auto_inline": int(tot.get("auto_inline", 0)),
        "auto_deferred": int(tot.get("auto_deferred", 0)),
        "auto_explored": int(tot.get("auto_explored", 0)),  # before 2026-11-26: in-band while deferring
        "auto_reference": int(tot.get("auto_reference", 0)),
        "auto_no_gain": int(tot.get("auto_no_gain", 0)),
        "auto_unsaturated": int(tot.get("auto_unsaturated", 0)),
        "auto_busy": tot["auto_busy"] if tot.get("auto_busy") else None,
        "auto_bound": tot["auto_bound"] if tot.get("auto_bound") else None,
        "auto_gain": tot["auto_gain"] if tot.get("auto_gain") else None,
        "deferred_requests": int(tot.get("deferred_requests", 0)),
        # launches, and those run unpadded (masked tokens left out); computed over real tokens
        "launches": int(tot["launches"]) if "launches" in tot else None,
        "unpadded_launches": int(tot["unpadded_launches"]) if "unpadded_launches" in tot else None,
        "computed_over_real_tokens": (
            tot["padded_tokens"] / tot["real_tokens"] if tot.get("real_tokens") and "padded_tokens" in tot else None
        ),
        # stalls: the longest execute() and the stubs' garbage-collector pauses (their longest, and the
        # time per execute they took), over every instance's life
        "execute_max_ms": tot.get("execute_max_ms"),
        "executes_over_10ms": int(tot["executes_over_10ms"]) if "executes_over_10ms" in tot else None,
        "gc_max_ms": tot.get("gc_max_ms"),
        "gc_gen2": int(tot["gc_gen2"]) if "gc_gen2" in tot else None,
        "gc_ms_per_execute": tot["gc_s"] / executes * 1e3 if "gc_s" in tot else None,
        # the live metrics' calls on the execute thread (each a round trip to the server): per execute, and the
        # longest time one execute() spent publishing
        "metric_calls_per_execute": tot["metric_calls"] / executes if "metric_calls" in tot else None,
        "publish_ms_per_execute": tot["publish_s"] / executes * 1e3 if "publish_s" in tot else None,
        "publish_max_ms": tot.get("publish_max_ms"),
        # the longest of each step of one batch, over every instance: where the executes over 10 ms went
        **{f"{step}_max_ms": tot[f"{step}_max_s"] * 1e3 if f"{step}_max_s" in tot else None for step in _STEPS},
    }


def config_instances(config: Mapping[str, Any]) -> int:
    """Model instances of a variant's config as the A/B JSON records it (``instance_group`` counts summed)."""
    return sum(int(g.get("count", 1)) for g in config.get("instance_group", [{}]))


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
    got = 0
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for load in _loads(doc.get("runs", [])):
        first = load[0]
        n = instances.get(first["variant"], 1)
        taken = []
        for records in logs:
            mine = []
            for i, r in enumerate(records):
                if r["model"] == first["model_name"]:
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


def _loads(runs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The runs grouped by the load that served them: consecutive runs of one variant, round and ``load_s``.

    A run without ``load_s`` (files before the fixed-rate rounds) is a load of its own.
    """
    loads: list[list[dict[str, Any]]] = []
    for run in runs:
        if loads and run.get("load_s") is not None and _load_key(run) == _load_key(loads[-1][0]):
            loads[-1].append(run)
        else:
            loads.append([run])
    return loads


def _load_key(run: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return run.get("variant"), run.get("round"), run.get("load_s")


def _mean_breakdown(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in runs[0].items():
        vals = [r.get(k) for r in runs]
        if all(isinstance(x, (int, float)) for x in vals):
            out[k] = float(np.mean([float(x) for x in vals if x is not None]))
        else:
            out[k] = v
    return out


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
