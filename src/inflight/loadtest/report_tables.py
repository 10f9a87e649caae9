"""The A/B report's tables: the side-by-side comparison with ratios to A, and every run.

Part of :mod:`inflight.loadtest.report`, with the helpers that read and format the runner's JSON
figures (missing ones print as ``n/a``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

NA = "n/a"


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(float(x)) else None


def _fmt(x: Any, digits: int = 1) -> str:
    v = _num(x)
    if v is None:
        return NA if not isinstance(x, str) else x
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def _gauge(x: Any) -> float | None:
    return _num(x.get("mean")) if isinstance(x, dict) else None


def _pct(x: Any) -> str:
    """A gauge summary (its mean) or a plain fraction as a percentage; a gauge's reason string as is."""
    v = _gauge(x) if isinstance(x, dict) else _num(x)
    return f"{100 * v:.1f}%" if v is not None else (x if isinstance(x, str) else NA)


# (row title, getter on a summary entry, formatter, shown ratio)
_Row = tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], str]]

ROWS: tuple[_Row, ...] = (
    ("req/s", lambda s: s.get("rps"), lambda x: _fmt(x, 1)),
    ("items/s", lambda s: s.get("items_per_s"), lambda x: _fmt(x, 1)),
    ("p50 latency (ms, exact)", lambda s: _get(s, "latency_ms", "p50"), lambda x: _fmt(x, 2)),
    ("p95 latency (ms, exact)", lambda s: _get(s, "latency_ms", "p95"), lambda x: _fmt(x, 2)),
    ("p99 latency (ms, exact)", lambda s: _get(s, "latency_ms", "p99"), lambda x: _fmt(x, 2)),
    ("requests", lambda s: s.get("requests"), lambda x: _fmt(x, 0)),
    ("failures", lambda s: s.get("failures"), lambda x: _fmt(x, 0)),
    ("server: queue (µs/request)", lambda s: _get(s, "server", "queue_us"), lambda x: _fmt(x, 1)),
    ("server: compute_input (µs/request)", lambda s: _get(s, "server", "compute_input_us"), lambda x: _fmt(x, 1)),
    ("server: compute_infer (µs/request)", lambda s: _get(s, "server", "compute_infer_us"), lambda x: _fmt(x, 1)),
    ("server: compute_output (µs/request)", lambda s: _get(s, "server", "compute_output_us"), lambda x: _fmt(x, 1)),
    ("server: executions", lambda s: _get(s, "server", "executions"), lambda x: _fmt(x, 0)),
    ("server: average batch (items)", lambda s: _get(s, "server", "avg_batch_items"), lambda x: _fmt(x, 1)),
    ("GPU activity", lambda s: s.get("gpu_activity"), _pct),
    ("sync share", lambda s: s.get("sync_share"), _pct),
    ("host CPU busy (the run's cores)", lambda s: _get(s, "cpu", "host_busy"), _pct),
    ("of which the hypervisor took (steal)", lambda s: _get(s, "cpu", "host_steal"), _pct),
    ("server CPU (cores: tritonserver + stubs)", lambda s: _get(s, "cpu", "server_cores"), lambda x: _fmt(x, 2)),
    ("stubs' CPU (cores)", lambda s: _get(s, "cpu", "stub_cores"), lambda x: _fmt(x, 2)),
    ("rest of the host's CPU (cores: Locust, ...)", lambda s: _get(s, "cpu", "other_cores"), lambda x: _fmt(x, 2)),
    ("server CPU (µs/request)", lambda s: _get(s, "cpu", "server_us_per_request"), lambda x: _fmt(x, 1)),
)


def _ratio(value: Any, base: Any) -> str:
    v = _gauge(value) if isinstance(value, dict) else _num(value)
    b = _gauge(base) if isinstance(base, dict) else _num(base)
    if v is None or b is None or b == 0:
        return NA
    return f"{v / b:.2f}x"


def comparison_table(doc: dict[str, Any]) -> str:
    """The side-by-side Markdown table: one column per variant, then the ratio of each to A."""
    summary: list[dict[str, Any]] = doc["summary"]
    if not summary:
        return "(no variants)\n"
    base = summary[0]
    head = ["", *(f"{s['variant']}: `{s['spec']}`" for s in summary), *(f"{s['variant']}/A" for s in summary[1:])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for title, get, fmt in ROWS:
        cells = [title, *(fmt(get(s)) for s in summary), *(_ratio(get(s), get(base)) for s in summary[1:])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def runs_table(doc: dict[str, Any]) -> str:
    """One line per Locust window, in the order they ran."""

    def _validity(r: dict[str, Any]) -> str:
        if not r.get("valid"):
            return "**no**"
        return "yes (client-limited)" if r.get("client_limited") else "yes"

    lines = [
        "| run | variant | req/s | p50 ms | p99 ms | requests | over s | failures | avg batch | host CPU busy "
        "| valid |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(doc["runs"], start=1):
        locust = r.get("locust") or {}
        lines.append(
            f"| {i} | {r['variant']} (round {r['round']}) | {_fmt(locust.get('rps'), 1)} | "
            f"{_fmt(_get(r, 'latency_ms', 'p50'), 2)} | {_fmt(_get(r, 'latency_ms', 'p99'), 2)} | "
            f"{_fmt(locust.get('requests'), 0)} | {_fmt(counted_span_s(locust), 1)} | "
            f"{_fmt(locust.get('failures'), 0)} | "
            f"{_fmt(_get(r, 'server', 'avg_batch_items'), 1)} | {_pct(_get(r, 'cpu', 'host_busy'))} | "
            f"{_validity(r)} |"
        )
    lines.append(
        "\nreq/s is the generator's own: the requests it counted divided by the span it counted them over "
        "(*over s*; Locust: from the end of spawning to its last answer). The spans differ a little between "
        "runs, so compare req/s, not request counts.\n"
    )
    return "\n".join(lines) + "\n"


def steps_table(doc: dict[str, Any]) -> str:
    """Each ensemble window's steps (tokenizer, encoder): Triton's queue and compute time a request; "" when none."""
    lines = []
    for i, r in enumerate(doc["runs"], start=1):
        for model, s in (r.get("steps") or {}).items():
            cells = (
                [NA] * 3 + [s["error"]]
                if "error" in s
                else [_fmt(s.get("queue_us")), _fmt(s.get("compute_infer_us")), _fmt(s.get("avg_batch_requests")), ""]
            )
            lines.append(f"| {i} | {r['variant']} (round {r['round']}) | `{model}` | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = [
        "| run | variant | step | queue (µs/request) | compute_infer (µs/request) | requests a batch | note |",
        "|---|---|---|---|---|---|---|",
    ]
    return "\n".join(head + lines) + "\n"


def counted_span_s(counts: dict[str, Any]) -> float | None:
    """The seconds a run's requests were counted over: ``requests / rps`` (None when either is missing)."""
    requests, rps = _num(counts.get("requests")), _num(counts.get("rps"))
    if requests is None or rps is None or rps <= 0:
        return None
    return requests / rps
