"""Summarise Nsight Systems sqlite exports: GPU activity, sync share, dispatches, a verdict.

Input: one or more ``nsys export --type sqlite`` files (``scripts/nsys_profile.sh`` writes
them). For each file, over the measured window -- first to last GPU activity by default, or
``--window-start/--window-end`` (ns on the report's timeline), or the span of the NVTX
range(s) with a given name -- it computes the figures of
:class:`inflight.profiling.activity.ActivitySummary` and names the regime. Several files are
shown side by side (Markdown + JSON), each with a timeline PNG of a few milliseconds.

Schema used (Nsight Systems "SQLite Export Schema Reference",
https://docs.nvidia.com/nsight-systems/UserGuide/index.html#exporter-sqlite-schema, earlier
https://docs.nvidia.com/nsight-systems/2021.5/nsys-exporter/exported_data.html; the joins follow
nsys's own ``nsys stats`` report scripts, e.g. ``cuda_gpu_mem_size_sum.py`` joining
``ENUM_CUDA_MEMCPY_OPER.id = CUPTI_ACTIVITY_KIND_MEMCPY.copyKind``):

* ``CUPTI_ACTIVITY_KIND_KERNEL(start, end, deviceId, streamId, correlationId, globalPid,
  shortName -> StringIds, ...)``; ``CUPTI_ACTIVITY_KIND_MEMCPY(..., bytes, copyKind)``;
  ``CUPTI_ACTIVITY_KIND_MEMSET(..., bytes)``.
* ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE(start, end, deviceId, streamId, correlationId, globalPid,
  graphId, graphExecId)``: one row per CUDA graph execution when the capture used
  ``--cuda-graph-trace=graph`` (the default); the graph's kernels are then *not* in the kernel
  table. (``CUDA_GRAPH_EVENTS`` / ``CUDA_GRAPH_NODE_EVENTS`` hold graph *creation* on the CPU
  timeline, not GPU execution, so they are not GPU activity.)
* ``CUPTI_ACTIVITY_KIND_RUNTIME`` / ``CUPTI_ACTIVITY_KIND_DRIVER(start, end, globalTid,
  correlationId, nameId -> StringIds)``; names carry version suffixes (``_v3020``).
* ``NVTX_EVENTS(start, end, text, textId -> StringIds, globalTid, ...)``.
* ``OSRT_API(start, end, globalTid, nameId -> StringIds)``.
* ``ENUM_CUDA_MEMCPY_OPER(id, name, label)``, ``TARGET_INFO_GPU(name, ...)``.
* ``globalTid``/``globalPid`` are serialized ids: ``pid = (g >> 24) & 0xFFFFFF``,
  ``tid = g & 0xFFFFFF`` ("Serialized process and thread identifiers" in the same reference).

Tables are created lazily by nsys (an empty kind has no table), so every table and every
optional column is checked before use.

Checked against a real export (nsys 2025.3.1, H200, torch CUDA-graph workload, 2026-11-21):
the column names above are those of ``PRAGMA table_info``; ``ENUM_CUDA_MEMCPY_OPER`` holds
``(1, 'CUDA_MEMCPY_KIND_HTOD', 'Host-to-Device')`` etc. (CUPTI's numbering, plus 11-13 for
unified memory); with ``--cuda-graph-trace=graph`` the export had 2889 GRAPH_TRACE rows, no
kernel table and 4 ``CUDA_GRAPH_EVENTS`` (creation) rows; with ``node`` it had the kernels, each
graph launch's kernels sharing its correlationId (same dispatch count and median either way).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inflight.profiling import activity as act
from inflight.profiling.activity import (
    DEFAULT_THRESHOLDS,
    ActivitySummary,
    ApiCalls,
    GpuOps,
    Ranges,
    Records,
    Thresholds,
)
from inflight.tool_errors import NsysExportError

LOGGER = logging.getLogger(__name__)

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER_TABLE = "CUPTI_ACTIVITY_KIND_DRIVER"
NVTX_TABLE = "NVTX_EVENTS"
OSRT_TABLE = "OSRT_API"
MEMCPY_ENUM = "ENUM_CUDA_MEMCPY_OPER"
GPU_INFO = "TARGET_INFO_GPU"

GPU_TABLES = (
    (KERNEL_TABLE, act.KERNEL),
    (MEMCPY_TABLE, act.MEMCPY),
    (MEMSET_TABLE, act.MEMSET),
    (GRAPH_TABLE, act.GRAPH),
)
API_TABLES = ((RUNTIME_TABLE, act.RUNTIME), (DRIVER_TABLE, act.DRIVER))

_COPY_CODE = {v.upper(): k for k, v in act.COPY_KINDS.items()}
_COPY_LABEL = {
    "HOST-TO-DEVICE": 1,
    "DEVICE-TO-HOST": 2,
    "HOST-TO-ARRAY": 3,
    "ARRAY-TO-HOST": 4,
    "ARRAY-TO-ARRAY": 5,
    "ARRAY-TO-DEVICE": 6,
    "DEVICE-TO-ARRAY": 7,
    "DEVICE-TO-DEVICE": 8,
    "HOST-TO-HOST": 9,
    "PEER-TO-PEER": 10,
}


def split_global_id(g: Any) -> tuple[Any, Any]:
    """Decode nsys serialized ``globalTid``/``globalPid`` values into ``(pid, tid)``.

    Args:
        g: One value or a numpy array.

    Returns:
        ``(pid, tid)`` of the same shape.
    """
    a = np.asarray(g, dtype=np.int64)
    return (a >> 24) & 0xFFFFFF, a & 0xFFFFFF


class NsysDb:
    """A read-only nsys sqlite export with table/column introspection.

    Args:
        path: The ``.sqlite`` file.

    Raises:
        NsysExportError: if the file does not exist or is not an sqlite database.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise NsysExportError(
                f"{self.path}: no such file; export one with `nsys export --type sqlite -o OUT.sqlite REPORT.nsys-rep`"
            )
        try:
            self.conn = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True)
            rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        except sqlite3.DatabaseError as e:
            raise NsysExportError(f"{self.path}: not an sqlite database ({e})") from None
        self.tables = {r[0] for r in rows}
        self._columns: dict[str, set[str]] = {}

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> NsysDb:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def has(self, table: str) -> bool:
        """Whether the export contains ``table`` (nsys omits empty ones)."""
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        """Column names of ``table`` (empty when the table is absent)."""
        if table not in self._columns:
            cols = set()
            if self.has(table):
                cols = {r[1] for r in self.conn.execute(f'PRAGMA table_info("{table}")')}
            self._columns[table] = cols
        return self._columns[table]

    def select(
        self, table: str, wanted: dict[str, str], where: str = "", params: Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        """Select columns, substituting a default expression for each missing one.

        Args:
            table: Table name.
            wanted: ``{column: default SQL expression}``, in output order.
            where: Optional ``WHERE`` clause body.
            params: Its parameters.

        Returns:
            The rows.
        """
        have = self.columns(table)
        exprs = [f'"{c}"' if c in have else f'{default} AS "{c}"' for c, default in wanted.items()]
        sql = f'SELECT {", ".join(exprs)} FROM "{table}"' + (f" WHERE {where}" if where else "")
        return self.conn.execute(sql, tuple(params)).fetchall()

    def strings(self, ids: Any) -> dict[int, str]:
        """``StringIds`` values for the given ids (missing ids map to ``"<id N>"``)."""
        wanted = sorted({int(i) for i in np.asarray(ids).reshape(-1).tolist()})
        out = {i: f"<id {i}>" for i in wanted}
        if not wanted or not self.has("StringIds"):
            return out
        for chunk in range(0, len(wanted), 900):  # SQLite's default host-parameter limit is 999
            part = wanted[chunk : chunk + 900]
            marks = ",".join("?" * len(part))
            for i, v in self.conn.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part):
                out[int(i)] = str(v)
        return out

    # -- metadata -----------------------------------------------------------------------------
    def gpu_names(self) -> list[str]:
        """GPU names from ``TARGET_INFO_GPU`` (empty when absent)."""
        if "name" not in self.columns(GPU_INFO):
            return []
        return sorted({str(r[0]) for r in self.conn.execute(f'SELECT name FROM "{GPU_INFO}"') if r[0]})

    def copy_kind_map(self) -> dict[int, int]:
        """Map nsys ``copyKind`` to the CUPTI memcpy kind, through ``ENUM_CUDA_MEMCPY_OPER``.

        Falls back to the identity (nsys mirrors CUPTI's numbering) when the enum is absent.
        """
        cols = self.columns(MEMCPY_ENUM)
        if "id" not in cols:
            return {}
        pick = [c for c in ("name", "label") if c in cols]
        if not pick:
            return {}
        out: dict[int, int] = {}
        for row in self.conn.execute(f'SELECT id, {", ".join(pick)} FROM "{MEMCPY_ENUM}"'):
            code = None
            for text in row[1:]:
                t = str(text or "").upper()
                suffix = t.rsplit("_", 1)[-1]
                if suffix in _COPY_CODE:
                    code = _COPY_CODE[suffix]
                elif t in _COPY_LABEL:
                    code = _COPY_LABEL[t]
                if code is not None:
                    break
            out[int(row[0])] = code if code is not None else int(row[0])
        return out

    # -- windows ------------------------------------------------------------------------------
    def gpu_span(self, device: int | None = None) -> tuple[int, int] | None:
        """First start to last end over every GPU table (optionally one device)."""
        lo: int | None = None
        hi: int | None = None
        for table, _ in GPU_TABLES:
            cols = self.columns(table)
            if not {"start", "end"} <= cols:
                continue
            where, params = "", []
            if device is not None and "deviceId" in cols:
                where, params = " WHERE deviceId = ?", [device]
            a, b = self.conn.execute(f'SELECT MIN(start), MAX("end") FROM "{table}"{where}', params).fetchone()
            if a is None:
                continue
            lo = int(a) if lo is None else min(lo, int(a))
            hi = int(b) if hi is None else max(hi, int(b))
        return None if lo is None or hi is None else (lo, hi)

    def nvtx_span(self, name: str) -> tuple[int, int, int]:
        """Span of the NVTX range(s) named ``name``: ``(first start, last end, count)``.

        Raises:
            NsysExportError: when the export has no NVTX data or no range with that name.
        """
        cols = self.columns(NVTX_TABLE)
        if not cols:
            raise NsysExportError(
                f"{self.path}: no NVTX_EVENTS table; capture with -t nvtx and push a range named {name!r}"
            )
        text = '"text"' if "text" in cols else "NULL"
        if "textId" in cols and self.has("StringIds"):
            text = f'COALESCE({text}, (SELECT value FROM StringIds WHERE id = "textId"))'
        sql = (
            f'SELECT MIN(start), MAX("end"), COUNT(*) FROM "{NVTX_TABLE}" '
            f'WHERE {text} = ? AND "end" IS NOT NULL AND "end" > start'
        )
        a, b, n = self.conn.execute(sql, (name,)).fetchone()
        if not n:
            names = [
                r[0]
                for r in self.conn.execute(
                    f'SELECT DISTINCT {text} FROM "{NVTX_TABLE}" WHERE "end" IS NOT NULL AND "end" > start LIMIT 20'
                )
            ]
            raise NsysExportError(f"{self.path}: no NVTX range named {name!r}; ranges present: {names}")
        return int(a), int(b), int(n)

    # -- records ------------------------------------------------------------------------------
    def load(self, lo: int, hi: int, *, device: int | None = None, osrt: bool = True) -> Records:
        """Load every record that overlaps ``[lo, hi)`` into :class:`Records`.

        Args:
            lo: Window start, ns.
            hi: Window end, ns.
            device: Only this device's GPU work.
            osrt: Also load ``OSRT_API``.

        Returns:
            The records (``window`` set to ``(lo, hi)``).
        """
        overlap = '"end" > ? AND start < ?'
        parts: list[GpuOps] = []
        copy_map = self.copy_kind_map()
        notes: list[str] = []
        for table, kind in GPU_TABLES:
            if not {"start", "end"} <= self.columns(table):
                continue
            where, params = overlap, [lo, hi]
            if device is not None and "deviceId" in self.columns(table):
                where += " AND deviceId = ?"
                params.append(device)
            rows = self.select(
                table,
                {
                    "start": "0",
                    "end": "0",
                    "deviceId": "0",
                    "streamId": "0",
                    "correlationId": "0",
                    "globalPid": "0",
                    "bytes": "0",
                    "copyKind": "0",
                },
                where,
                params,
            )
            if not rows:
                continue
            a = np.asarray(rows, dtype=np.int64)
            copy_kind = a[:, 7]
            if kind == act.MEMCPY and copy_map:
                copy_kind = np.asarray([copy_map.get(int(c), int(c)) for c in copy_kind], dtype=np.int64)
            elif kind != act.MEMCPY:
                copy_kind = np.zeros(len(a), dtype=np.int64)
            pid, _ = split_global_id(a[:, 5])
            ok = a[:, 1] >= a[:, 0]
            if not ok.all():
                notes.append(f"{table}: dropped {int((~ok).sum())} rows that end before they start")
            parts.append(
                GpuOps.from_columns(
                    kind=np.full(len(a), kind, dtype=np.int8)[ok],
                    start=a[ok, 0],
                    end=a[ok, 1],
                    device=a[ok, 2],
                    stream=a[ok, 3],
                    correlation=a[ok, 4],
                    process=pid[ok],
                    bytes=a[ok, 6],
                    copy_kind=copy_kind[ok],
                )
            )
        gpu = GpuOps.concat(parts)
        if self.has(GRAPH_TABLE) and len(gpu) and not (gpu.kind == act.KERNEL).any():
            notes.append(
                "graph-level trace: kernels inside CUDA graphs are not traced one by one (use --cuda-graph-trace=node)"
            )

        api_parts: list[ApiCalls] = []
        for table, domain in API_TABLES:
            if not {"start", "end", "nameId"} <= self.columns(table):
                continue
            rows = self.select(
                table,
                {"start": "0", "end": "0", "globalTid": "0", "correlationId": "0", "nameId": "0"},
                overlap,
                (lo, hi),
            )
            if not rows:
                continue
            a = np.asarray(rows, dtype=np.int64)
            api_parts.append(self._api(a, domain))
        api = ApiCalls.concat(api_parts)

        ranges = Ranges.empty()
        if osrt and {"start", "end", "nameId"} <= self.columns(OSRT_TABLE):
            rows = self.select(
                OSRT_TABLE, {"start": "0", "end": "0", "globalTid": "0", "nameId": "0"}, overlap, (lo, hi)
            )
            if rows:
                a = np.asarray(rows, dtype=np.int64)
                names = self._names(a[:, 3], base=False)
                pid, tid = split_global_id(a[:, 2])
                ranges = Ranges(start=a[:, 0], end=a[:, 1], process=pid, thread=tid, name=names)
        return Records(gpu=gpu, api=api, osrt=ranges, window=(lo, hi), notes=notes)

    def _names(self, ids: Any, *, base: bool) -> Any:
        uniq, inverse = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True)
        text = self.strings(uniq)
        values = np.empty(uniq.size, dtype=object)
        for i, u in enumerate(uniq.tolist()):
            values[i] = act.api_base_name(text[u]) if base else text[u]
        return values[inverse.reshape(-1)]

    def _api(self, a: Any, domain: int) -> ApiCalls:
        pid, tid = split_global_id(a[:, 2])
        return ApiCalls(
            domain=np.full(len(a), domain, dtype=np.int8),
            start=a[:, 0],
            end=a[:, 1],
            process=pid,
            thread=tid,
            correlation=a[:, 3],
            name=self._names(a[:, 4], base=True),
        )

    def top_kernels(self, lo: int, hi: int, *, device: int | None = None, limit: int = 5) -> list[dict[str, Any]]:
        """Kernels with the most GPU time among those starting in ``[lo, hi)``."""
        cols = self.columns(KERNEL_TABLE)
        name_col = next((c for c in ("shortName", "demangledName", "mangledName") if c in cols), None)
        if name_col is None or not {"start", "end"} <= cols:
            return []
        where, params = "start >= ? AND start < ?", [lo, hi]
        if device is not None and "deviceId" in cols:
            where += " AND deviceId = ?"
            params.append(device)
        rows = self.conn.execute(
            f'SELECT "{name_col}", COUNT(*), SUM("end" - start) FROM "{KERNEL_TABLE}" WHERE {where} '
            f'GROUP BY "{name_col}" ORDER BY 3 DESC LIMIT ?',
            (*params, limit),
        ).fetchall()
        names = self.strings([r[0] for r in rows])
        return [
            {
                "name": names[int(r[0])],
                "count": int(r[1]),
                "total_ms": int(r[2]) / 1e6,
                "avg_us": int(r[2]) / int(r[1]) / 1e3,
            }
            for r in rows
        ]


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
        }


#: Written beside the export by ``nsys_profile.sh --metrics-url``: one metrics scrape per line.
LIVE_METRICS_FILE = "live_metrics.jsonl"


def read_live_metrics(path: str | Path) -> dict[str, Any] | None:
    """Live metrics scraped during an nsys capture: the backend's and Triton's own.

    Each line of the file is ``{"unix", "since_start_s", "text", "error"}`` (``text``: Triton's
    Prometheus page). The CUPTI gauges are rolling windows, so samples taken every window length
    inside the capture tile it; their mean describes the same seconds as the nsys summary. The
    backend's CUPTI gauges cannot run under nsys (CUPTI allows one subscriber per process: it
    answers ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED), but Triton's ``nv_gpu_utilization`` (NVML,
    the share of each sample period in which a kernel ran) and the backend's counters can.

    Args:
        path: ``live_metrics.jsonl``.

    Returns:
        None when the file does not exist, else ``{"samples", "failed_scrapes", "gpu_activity",
        "sync_share", "triton_gpu_utilization", "in_flight"}`` (each ``{"mean", "min", "max", "n"}``
        or ``"not available"``; the GPU utilization is the mean over the GPUs the server sees) and,
        from the first and last scrape, ``"batches"``, ``"mean_batch_items"`` and ``"slot_waits"``
        (None when absent).
    """
    from inflight.loadtest.prometheus import metric_values
    from inflight.loadtest.stats import GPU_GAUGES, summarize_gauge

    p = Path(path)
    if not p.is_file():
        return None
    samples = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    texts = [x.get("text") or "" for x in samples]
    out: dict[str, Any] = {"samples": len(samples), "failed_scrapes": sum(1 for x in samples if x.get("error"))}
    gauges = {**GPU_GAUGES, "triton_gpu_utilization": "nv_gpu_utilization", "in_flight": "inflight_in_flight"}
    for key, metric in gauges.items():
        per_sample: list[float | None] = []
        for text in texts:
            values = metric_values(text, metric, None)
            if key == "in_flight":  # batches in flight in the whole model: sum over instances
                per_sample.append(float(np.sum(values)) if values else None)
            else:
                per_sample.append(float(np.mean(values)) if values else None)
        out[key] = summarize_gauge(per_sample)

    def delta(metric: str) -> float | None:
        scraped = [sum(v) for v in (metric_values(t, metric, None) for t in texts if t) if v]
        return scraped[-1] - scraped[0] if len(scraped) >= 2 else None

    # the counters (exact); the batch-size histogram holds a sample of the batches since 2026-11-26, so only
    # scrapes from before the counters existed fall back to it
    batches, items = delta("inflight_batches_total"), delta("inflight_items_total")
    if batches is None or items is None:
        items, batches = delta("inflight_batch_size_sum"), delta("inflight_batch_size_count")
    out["batches"] = batches
    out["mean_batch_items"] = items / batches if items is not None and batches else None
    out["slot_waits"] = delta("inflight_slot_waits_total")
    return out


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
    dur = act.clipped_durations(osrt.start, osrt.end, lo, hi)
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
        summary = act.summarize(records, lo, hi, device=device, thresholds=thresholds)
        fs = FileSummary(
            path=p,
            label=label or p.stem,
            summary=summary,
            gpu_names=db.gpu_names(),
            window_source=source,
            top_kernels=db.top_kernels(lo, hi, device=device),
            sync_calls_by_thread=dict(
                sorted(act.sync_calls_by_thread(records.api, lo, hi).items(), key=lambda kv: -kv[1])[:8]
            ),
            osrt_top=_osrt_top(records.osrt, lo, hi),
            notes=notes,
            live=read_live_metrics(p.parent / LIVE_METRICS_FILE),
        )
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


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label) or "trace"


# -- rendering ------------------------------------------------------------------------------------


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
