"""Read Nsight Systems sqlite exports: the tables, their optional columns, records over a window.

:class:`NsysDb` opens one ``nsys export --type sqlite`` file read-only and loads what overlaps a
window into :class:`inflight.profiling.activity.Records`; :mod:`~inflight.profiling.nsys_summary`
computes the figures from them.

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

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inflight.profiling import activity as act
from inflight.profiling.activity import ApiCalls, GpuOps, Ranges, Records
from inflight.tool_errors import NsysExportError

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
