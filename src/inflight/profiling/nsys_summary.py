"""Summarise Nsight Systems sqlite exports: GPU activity, sync share, dispatches, a verdict.

Input: one or more ``nsys export --type sqlite`` files (``scripts/nsys_profile.sh`` writes
them). For each file, over the measured window -- first to last GPU activity by default, or
``--window-start/--window-end`` (ns on the report's timeline), or the span of the NVTX
range(s) with a given name -- it computes the figures of
:class:`inflight.profiling.regime.ActivitySummary` and names the regime. Several files are
shown side by side (Markdown + JSON), each with a timeline PNG of a few milliseconds.

The export is read by :mod:`~inflight.profiling.nsys_db` (which lists the schema it relies on), the
live metrics scraped beside it by :mod:`~inflight.profiling.nsys_live`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inflight.profiling.activity import Ranges
from inflight.profiling.figures import clipped_durations, sync_calls_by_thread
from inflight.profiling.nsys_db import DRIVER_TABLE, GPU_TABLES, RUNTIME_TABLE, NsysDb
from inflight.profiling.nsys_live import LIVE_METRICS_FILE, read_live_metrics
from inflight.profiling.regime import DEFAULT_THRESHOLDS, ActivitySummary, Thresholds, summarize
from inflight.tool_errors import NsysExportError

LOGGER = logging.getLogger(__name__)

#: Written beside the export by ``scripts/nsys_profile.sh``: the load command's output (``--load``).
LOAD_LOG_FILE = "load.log"


@dataclass
class FileSummary:
    """The summary of one export.

    Attributes:
        path: The sqlite file.
        label: Column title (file stem unless given).
        summary: The figures.
        gpu_names: From ``TARGET_INFO_GPU``.
        window_source: ``gpu-span``, ``explicit`` or ``nvtx:<name> (n ranges)``.
        top_kernels: Kernels with the most GPU time.
        sync_calls_by_thread: ``{tid: count}`` of the busiest synchronising threads.
        osrt_top: OS-runtime calls with the most time.
        notes: Remarks (missing tables, graph-level trace, dropped rows).
        timeline: The PNG written for this file, if any.
        live: The backend's live gauges scraped during the capture (:func:`read_live_metrics`), if any.
        load: The load generator's figures from ``load.log`` beside the export
            (``inflight.loadtest.rategen.read_summary_line``), if it holds them.
    """

    path: Path
    label: str
    summary: ActivitySummary
    gpu_names: list[str] = field(default_factory=list)
    window_source: str = "gpu-span"
    top_kernels: list[dict[str, Any]] = field(default_factory=list)
    sync_calls_by_thread: dict[int, int] = field(default_factory=dict)
    osrt_top: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timeline: Path | None = None
    live: dict[str, Any] | None = None
    load: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "file": str(self.path),
            "label": self.label,
            "gpu_names": self.gpu_names,
            "window_source": self.window_source,
            "summary": self.summary.to_dict(),
            "top_kernels": self.top_kernels,
            "sync_calls_by_thread": {str(k): v for k, v in self.sync_calls_by_thread.items()},
            "osrt_top": self.osrt_top,
            "notes": self.notes,
            "timeline": None if self.timeline is None else str(self.timeline),
            "live": self.live,
            "load": self.load,
        }


def live_gauge_text(live: dict[str, Any] | None, key: str, pct: Callable[[float | None], str] | None = None) -> str:
    """One gauge of :func:`read_live_metrics` as table text: mean (min to max, n samples).

    Args:
        live: ``read_live_metrics`` output; None or empty when nothing was scraped.
        key: The gauge (``gpu_activity``, ``sync_share``, ``triton_gpu_utilization``, ``in_flight``).
        pct: Percentage formatter (default: this module's).

    Returns:
        ``"-"`` without scrapes, ``"not available"`` when the scrapes lacked the gauge.
    """
    if not live:
        return "-"
    g = live.get(key)
    if not isinstance(g, dict):
        return "not available"
    fmt = pct or _pct
    return f"{fmt(g['mean'])} ({fmt(g['min'])} to {fmt(g['max'])}, {g['n']} samples)"


def _osrt_top(osrt: Ranges, lo: int, hi: int, limit: int = 5) -> list[dict[str, Any]]:
    if len(osrt) == 0:
        return []
    dur = clipped_durations(osrt.start, osrt.end, lo, hi)
    names = osrt.name.astype(str)
    uniq, inverse = np.unique(names, return_inverse=True)
    totals = np.bincount(inverse.reshape(-1), weights=dur.astype(np.float64), minlength=uniq.size)
    counts = np.bincount(inverse.reshape(-1), minlength=uniq.size)
    order = np.argsort(-totals)[:limit]
    return [
        {"name": str(uniq[i]), "calls": int(counts[i]), "total_ms": float(totals[i]) / 1e6}
        for i in order
        if totals[i] > 0
    ]


def _window(
    db: NsysDb, window_start: int | None, window_end: int | None, nvtx: str | None, device: int | None
) -> tuple[int, int, str]:
    if nvtx is not None:
        a, b, n = db.nvtx_span(nvtx)
        return a, b, f"nvtx:{nvtx} ({n} range{'s' if n != 1 else ''})"
    if window_start is not None and window_end is not None:
        return window_start, window_end, "explicit"
    span = db.gpu_span(device)
    if span is None:
        raise NsysExportError(
            f"{db.path}: no GPU activity (no kernel, memcpy, memset or graph trace table) and no explicit window; "
            "was the capture taken while the GPU was working (-t cuda)?"
        )
    explicit = window_start is not None or window_end is not None
    lo = span[0] if window_start is None else window_start
    hi = span[1] if window_end is None else window_end
    return lo, hi, "explicit" if explicit else "gpu-span"


def summarize_file(
    path: str | Path,
    *,
    label: str | None = None,
    window_start: int | None = None,
    window_end: int | None = None,
    nvtx: str | None = None,
    device: int | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    timeline_dir: Path | None = None,
    timeline_ms: float = 5.0,
    timeline_at: int | None = None,
) -> FileSummary:
    """Summarise one nsys sqlite export.

    Args:
        path: The ``.sqlite`` file.
        label: Column title (default: the file stem).
        window_start: Window start, ns on the report's timeline.
        window_end: Window end, ns.
        nvtx: Use the span of the NVTX range(s) with this text as the window.
        device: Only this GPU.
        thresholds: Verdict thresholds.
        timeline_dir: Write ``<label>.timeline.png`` here (None: no PNG).
        timeline_ms: Length of the timeline slice.
        timeline_at: Start of the slice, ns (default: the middle of the window).

    Returns:
        The summary.

    Raises:
        NsysExportError: for a missing/invalid file, an unknown NVTX range, or no window.
    """
    p = Path(path)
    with NsysDb(p) as db:
        notes: list[str] = []
        missing = [t for t, _ in GPU_TABLES[:2] if not db.has(t)]
        if missing:
            notes.append(f"tables absent (nothing of that kind was captured): {', '.join(missing)}")
        if not db.has(RUNTIME_TABLE) and not db.has(DRIVER_TABLE):
            notes.append("no CUDA API tables: sync/launch shares are 0 (capture with -t cuda)")
        lo, hi, source = _window(db, window_start, window_end, nvtx, device)
        if hi <= lo:
            raise NsysExportError(f"{p}: empty window [{lo}, {hi})")
        records = db.load(lo, hi, device=device)
        notes.extend(records.notes)
        summary = summarize(records, lo, hi, device=device, thresholds=thresholds)
        fs = FileSummary(
            path=p,
            label=label or p.stem,
            summary=summary,
            gpu_names=db.gpu_names(),
            window_source=source,
            top_kernels=db.top_kernels(lo, hi, device=device),
            sync_calls_by_thread=dict(
                sorted(sync_calls_by_thread(records.api, lo, hi).items(), key=lambda kv: -kv[1])[:8]
            ),
            osrt_top=_osrt_top(records.osrt, lo, hi),
            notes=notes,
            live=read_live_metrics(p.parent / LIVE_METRICS_FILE),
        )
    _read_load(fs, p.parent / LOAD_LOG_FILE)
    if fs.live is not None and not isinstance(fs.live.get("gpu_activity"), dict):
        logs = [p.parent / "server.log", p.parent / "tritonserver.log"]  # nsys_profile.sh's, Triton's
        why = [
            ln.strip()
            for log in logs
            if log.is_file()
            for ln in log.read_text(errors="replace").splitlines()
            if "live CUPTI metrics are unavailable" in ln
        ]
        fs.notes.append(
            "live CUPTI gauges absent during the capture"
            + (f": {why[0]}" if why else " (no model with cupti=true, or its metrics are off)")
        )
    if timeline_dir is not None and timeline_ms > 0:
        from inflight.profiling.timeline import plot_timeline, slice_at

        t0, t1 = slice_at(lo, hi, timeline_ms, timeline_at)
        out = Path(timeline_dir) / f"{_safe(fs.label)}.timeline.png"
        try:
            plot_timeline(records, t0, t1, out, title=f"{fs.label}: {summary.verdict.regime}")
            fs.timeline = out
        except ImportError as e:
            fs.notes.append(f"no timeline PNG: {e}")
    return fs


def _read_load(fs: FileSummary, log: Path) -> None:
    """The generator's figures from the load's log (``nsys_profile.sh``'s), and a note when it fell behind."""
    from inflight.loadtest import openloop as ol
    from inflight.loadtest.rategen import fell_behind, read_summary_line

    fs.load = read_summary_line(log.read_text(errors="replace")) if log.is_file() else None
    if fs.load is not None and fell_behind(fs.load["very_late_fraction"]):
        fs.notes.append(
            f"the load generator fell behind: {fs.load['very_late_fraction']:.1%} of its sends were over "
            f"{ol.LIMIT_LATE_MS:.0f} ms late and {fs.load['rps']:,.0f} of the {fs.load['offered_rps']:,.0f} req/s "
            "offered were answered. The server was past its capacity under the profiler, so this capture shows it "
            "saturated, not at the offered rate: profile at a lower rate for the activity at a rate it holds"
        )


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label) or "trace"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def to_markdown(files: Sequence[FileSummary]) -> str:
    """Side-by-side Markdown table of several summaries, then each verdict and its details.

    Args:
        files: The summaries, one column each.

    Returns:
        Markdown text.
    """
    rows: list[tuple[str, list[str]]] = []

    def row(title: str, f: Any) -> None:
        rows.append((title, [f(x.summary) for x in files]))

    row("window (ms)", lambda s: f"{s.wall_s * 1e3:.1f}")
    row("**GPU activity** (union / wall)", lambda s: _pct(s.gpu_activity))
    row("**sync share** of CUDA API time", lambda s: _pct(s.sync_share))
    row("sync share on the launching threads", lambda s: _pct(s.issue_sync_share))
    row("launch share of CUDA API time", lambda s: _pct(s.launch_share))
    row("memcpy-call share of CUDA API time", lambda s: _pct(s.copy_share))
    row("kernel median (µs)", lambda s: _num(s.kernel_median_us))
    row("dispatch median (µs)", lambda s: _num(s.dispatch_median_us))
    row("dispatches (kernel + graph launches)", lambda s: f"{s.dispatches}")
    row("dispatches / s", lambda s: f"{s.dispatches_per_s:,.0f}")
    row("kernels / graph executions", lambda s: f"{s.kernels} / {s.graph_executions}")
    row("H2D copies (avg bytes)", lambda s: f"{s.h2d_copies} ({_num(s.h2d_avg_bytes, '{:,.0f}')})")
    row("D2H copies (avg bytes)", lambda s: f"{s.d2h_copies} ({_num(s.d2h_avg_bytes, '{:,.0f}')})")
    row("idle gaps (median / p90 µs)", lambda s: f"{s.gap_count} ({_num(s.gap_median_us)} / {_num(s.gap_p90_us)})")
    row("sync calls", lambda s: f"{s.sync_calls}")
    row("CUDA API time (s, all threads)", lambda s: f"{s.api_time_s:.3f}")
    row("OS-runtime wait share of CUDA threads", lambda s: _pct(s.osrt_wait_share))
    row("**regime**", lambda s: f"**{s.verdict.regime}**")
    if any(f.live is not None for f in files):

        def live(key: str) -> list[str]:
            return [live_gauge_text(f.live, key) for f in files]

        rows.append(("live CUPTI GPU activity, same window (backend gauge)", live("gpu_activity")))
        rows.append(("live CUPTI sync share, same window (backend gauge)", live("sync_share")))
        rows.append(("live GPU utilization, same window (Triton nv_gpu_utilization)", live("triton_gpu_utilization")))

    if any(f.load is not None for f in files):
        rows.append(("load: offered / answered (req/s)", [_load_rates(f.load) for f in files]))
        from inflight.loadtest.openloop import LIMIT_LATE_MS

        rows.append((f"load: sends over {LIMIT_LATE_MS:.0f} ms late", [_load_late(f.load) for f in files]))

    head = "| figure | " + " | ".join(f.label for f in files) + " |"
    sep = "|---|" + "---:|" * len(files)
    lines = ["# nsys summary", "", head, sep]
    lines += [f"| {title} | " + " | ".join(vals) + " |" for title, vals in rows]
    for f in files:
        s = f.summary
        lines += ["", f"## {f.label}", "", f"- file: `{f.path}`"]
        if f.gpu_names:
            lines.append(f"- GPU: {', '.join(f.gpu_names)}")
        lines.append(f"- window: [{s.window_start_ns}, {s.window_end_ns}) ns ({f.window_source})")
        lines.append(f"- **{s.verdict.regime}**: {s.verdict.reason}")
        if len(s.gpu_activity_by_device) > 1:
            per = ", ".join(f"GPU {d}: {_pct(v)}" for d, v in s.gpu_activity_by_device.items())
            lines.append(f"- activity per device: {per}")
        if f.sync_calls_by_thread:
            per = ", ".join(f"{tid}: {n}" for tid, n in f.sync_calls_by_thread.items())
            lines.append(f"- sync calls by thread id: {per}")
        for k in f.top_kernels:
            lines.append(f"- kernel `{k['name']}`: {k['count']} x {k['avg_us']:.1f} µs = {k['total_ms']:.2f} ms")
        for o in f.osrt_top:
            lines.append(f"- OS runtime `{o['name']}`: {o['calls']} calls, {o['total_ms']:.2f} ms")
        if f.timeline is not None:
            lines.append(f"- timeline: ![{f.label}]({f.timeline.name})")
        for n in f.notes:
            lines.append(f"- note: {n}")
    return "\n".join(lines) + "\n"


def _load_rates(load: dict[str, float] | None) -> str:
    return "-" if load is None else f"{load['offered_rps']:,.0f} / {load['rps']:,.0f}"


def _load_late(load: dict[str, float] | None) -> str:
    from inflight.loadtest.rategen import fell_behind

    if load is None:
        return "-"
    late = load["very_late_fraction"]
    return _pct(late) + (" (**behind**: saturated)" if fell_behind(late) else "")


def to_json(files: Sequence[FileSummary]) -> str:
    """The summaries as a JSON document ``{"files": [...]}``."""
    return json.dumps({"files": [f.to_dict() for f in files]}, indent=2, default=str)


def run(
    paths: Sequence[str | Path],
    *,
    out: Path | None = None,
    labels: Sequence[str] | None = None,
    window_start: int | None = None,
    window_end: int | None = None,
    nvtx: str | None = None,
    device: int | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    timeline_ms: float = 5.0,
    timeline_at: int | None = None,
) -> list[FileSummary]:
    """Summarise several exports; write ``summary.md``, ``summary.json`` and timelines to ``out``.

    Args:
        paths: sqlite exports.
        out: Output folder (None: write nothing).
        labels: Column titles, one per path.
        window_start: Window start, ns (all files).
        window_end: Window end, ns (all files).
        nvtx: NVTX range name giving the window.
        device: Only this GPU.
        thresholds: Verdict thresholds.
        timeline_ms: Timeline slice length (0: no PNG).
        timeline_at: Timeline slice start, ns.

    Returns:
        One summary per path.

    Raises:
        NsysExportError: for unusable inputs.
        ValueError: when ``labels`` does not match ``paths``.
    """
    if labels and len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} files; give one --label per file or none")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    files = [
        summarize_file(
            p,
            label=labels[i] if labels else None,
            window_start=window_start,
            window_end=window_end,
            nvtx=nvtx,
            device=device,
            thresholds=thresholds,
            timeline_dir=out,
            timeline_ms=timeline_ms,
            timeline_at=timeline_at,
        )
        for i, p in enumerate(paths)
    ]
    seen: dict[str, int] = {}
    for f in files:  # distinct column titles
        n = seen.get(f.label, 0)
        seen[f.label] = n + 1
        if n:
            f.label = f"{f.label}#{n + 1}"
    if out is not None:
        (out / "summary.md").write_text(to_markdown(files))
        (out / "summary.json").write_text(to_json(files))
        LOGGER.info("wrote %s and %s", out / "summary.md", out / "summary.json")
    return files
