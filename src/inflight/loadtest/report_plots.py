"""The A/B report's PNG plots: throughput over time, latency percentiles, GPU activity, the open-loop curves.

Part of :mod:`inflight.loadtest.report`; each plot is drawn from the runner's JSON alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inflight.loadtest.report_tables import _get, _num
from inflight.loadtest.stats import COUNT_SPAN_S

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def plot_open_loop(doc: dict[str, Any], path: Path) -> Path | None:
    """Latency percentiles and achieved rate against offered rate, one line per variant, the SLO drawn."""
    from matplotlib.figure import Figure

    if doc["load"].get("closed_loop", True):
        return None
    summary = [s for s in doc["summary"] if s.get("sweep")]
    if not summary:
        return None
    slo = _num(_get(doc, "load", "open_loop", "slo_p99_ms"))
    colors = _variant_colors(doc)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    top = 0.0
    for s in summary:
        pts = sorted(s["sweep"], key=lambda p: p["offered_rps"])
        xs = [p["offered_rps"] for p in pts]
        c = colors[s["variant"]]
        for key, style in (("p99_ms", "-"), ("p50_ms", ":")):
            ys = [_num(p.get(key)) for p in pts]
            ax1.plot(
                [x for x, y in zip(xs, ys, strict=True) if y is not None],
                [y for y in ys if y is not None],
                style,
                marker="o",
                color=c,
                label=f"{s['variant']} {key[:3]}: {s['spec']}" if key == "p99_ms" else f"{s['variant']} p50",
            )
        ax2.plot(xs, [p["achieved_rps"] for p in pts], marker="o", color=c, label=f"{s['variant']}: {s['spec']}")
        cap = _num(s.get("capacity_rps"))
        if cap is not None:
            ax2.axvline(cap, color=c, linestyle="--", alpha=0.6)
        top = max(top, *xs)
    if slo is not None:
        ax1.axhline(slo, color="k", linestyle="--", alpha=0.6, label=f"SLO p99 {slo:g} ms")
    ax1.set_yscale("log")
    ax1.set_xlabel("offered rate (requests/s)")
    ax1.set_ylabel("latency from the scheduled send (ms)")
    ax1.set_title("Latency against offered rate (open loop)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize="x-small")
    ax2.plot([0, top], [0, top], color="0.6", linewidth=0.8, label="achieved = offered")
    ax2.set_xlabel("offered rate (requests/s)")
    ax2.set_ylabel("achieved rate (successful answers/s)")
    ax2.set_title("Achieved against offered (dashed: capacity at the SLO)")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize="x-small")
    fig.savefig(path, dpi=110)
    return path


def _variant_colors(doc: dict[str, Any]) -> dict[str, str]:
    return {v["label"]: _COLORS[i % len(_COLORS)] for i, v in enumerate(doc["variants"])}


def plot_throughput(doc: dict[str, Any], path: Path) -> Path | None:
    """Req/s over time, one line per run (Locust's stats history)."""
    from matplotlib.figure import Figure

    colors = _variant_colors(doc)
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.add_subplot()
    drawn = False
    for r in doc["runs"]:
        h = r.get("history") or []
        key = "rps_counted" if any("rps_counted" in p for p in h) else "rps"  # older JSON: Locust's rate
        pts = [(p["t"], p[key]) for p in h if _num(p.get(key)) is not None]
        if not pts:
            continue
        ax.plot(
            [t for t, _ in pts],
            [y for _, y in pts],
            color=colors.get(r["variant"], "k"),
            linestyle=("-", "--", ":", "-.")[(r["round"] - 1) % 4],
            label=f"{r['variant']} round {r['round']}",
        )
        drawn = True
    if not drawn:
        return None
    ax.set_xlabel("seconds since the Locust run started")
    ax.set_ylabel(f"requests/s (request count over {COUNT_SPAN_S:g} s)")
    ax.set_title(f"Throughput over time, {doc['id']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    return path


def plot_latency(doc: dict[str, Any], path: Path) -> Path | None:
    """Exact p50/p95/p99 bars per variant and the percentile curve."""
    from matplotlib.figure import Figure

    summary = doc["summary"]
    if not any(_num(_get(s, "latency_ms", "p50")) is not None for s in summary):
        return None
    colors = _variant_colors(doc)
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    keys = ("p50", "p95", "p99")
    width = 0.8 / max(1, len(summary))
    for i, s in enumerate(summary):
        vals = [_num(_get(s, "latency_ms", k)) or 0.0 for k in keys]
        xs = [k + (i - (len(summary) - 1) / 2) * width for k in range(len(keys))]
        bars = ax1.bar(xs, vals, width, color=colors[s["variant"]], label=f"{s['variant']}: {s['spec']}")
        ax1.bar_label(bars, fmt="%.1f", fontsize="x-small")
        curve = _get(s, "latency_ms", "curve") or {}
        qs = [q for q in curve if _num(curve[q]) is not None]
        ax2.plot(range(len(qs)), [curve[q] for q in qs], marker="o", color=colors[s["variant"]], label=s["variant"])
        ax2.set_xticks(range(len(qs)), [q for q in qs], rotation=45, fontsize="small")
    ax1.set_xticks(range(len(keys)), list(keys))
    ax1.set_ylabel("latency (ms, exact)")
    ax1.set_title("Latency percentiles per variant")
    ax1.legend(fontsize="x-small")
    ax2.set_xlabel("percentile")
    ax2.set_ylabel("latency (ms)")
    ax2.set_yscale("log")
    ax2.set_title("Latency by percentile")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    return path


def plot_gpu(doc: dict[str, Any], path: Path) -> Path | None:
    """GPU activity and sync share per variant; None when no variant published them."""
    from matplotlib.figure import Figure

    summary = doc["summary"]
    if not any(isinstance(s.get("gpu_activity"), dict) or isinstance(s.get("sync_share"), dict) for s in summary):
        return None
    colors = _variant_colors(doc)
    fig = Figure(figsize=(9, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    titles = {"gpu_activity": "GPU activity", "sync_share": "Sync share of CUDA API time"}
    for ax, (key, title) in zip(axes, titles.items(), strict=True):
        labels: list[str] = []
        vals: list[float] = []
        lo: list[float] = []
        hi: list[float] = []
        cols: list[str] = []
        for s in summary:
            g = s.get(key)
            if not isinstance(g, dict):
                continue
            labels.append(s["variant"])
            vals.append(100 * g["mean"])
            lo.append(100 * (g["mean"] - g["min"]))
            hi.append(100 * (g["max"] - g["mean"]))
            cols.append(colors[s["variant"]])
        ax.bar(labels, vals, color=cols, yerr=[lo, hi], capsize=4)
        ax.set_ylim(0, 105)
        ax.set_ylabel("% (mean of samples, min-max bars)")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)
    return path
