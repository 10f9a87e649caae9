"""Records as a Chrome / Perfetto trace (JSON ``traceEvents``), to open in ui.perfetto.dev.

Layout (Trace Event Format, "Complete" ``X`` events, timestamps in microseconds relative to
the first event; https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):

* one *process* per GPU (``pid = GPU_PID_BASE + device``, named ``GPU <device>``) with one
  *thread* per stream (``tid = stream``, named ``stream <id>``): kernels, copies (named by
  direction and size), memsets, graph executions;
* one process per host process (its OS pid) with one thread per OS thread (``tid`` = the
  CUPTI/nsys thread id = ``threading.get_native_id()``), named from ``Records.thread_names``
  when known: CUDA API calls (category ``sync``, ``launch``, ``memcpy_api`` or ``cuda_api``) and NVTX ranges
  (category ``nvtx``; instantaneous marks become ``i`` events);
* optional flow arrows (``s``/``f`` events, ``bp: "e"``) from each launch call to the first
  GPU work with its correlation id.

NVTX ranges come from CUPTI's MARKER records (see :mod:`~inflight.profiling.cupti_live`):
``CuptiWindow(markers=True)`` in a process started with ``NVTX_INJECTION64_PATH`` = libcupti
records ``torch.cuda.nvtx`` ranges; without the variable there are none and the trace simply has
no ``nvtx`` events.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from inflight.profiling import activity as act
from inflight.profiling.activity import Records

LOGGER = logging.getLogger(__name__)

#: GPU "processes" get pids above any Linux pid (pid_max <= 2**22).
GPU_PID_BASE = 1 << 23


def _us(ns: int, t0: int) -> float:
    return (int(ns) - t0) / 1e3


def _copy_name(copy_kind: int, nbytes: int) -> str:
    return f"memcpy {act.COPY_KINDS.get(int(copy_kind), 'unknown')} {int(nbytes):,} B"


def trace_events(records: Records, *, flows: bool = True, t0: int | None = None) -> list[dict[str, Any]]:
    """Build the ``traceEvents`` list.

    Args:
        records: The collection.
        flows: Add launch -> GPU flow arrows.
        t0: Time origin, ns (default: the earliest timestamp in the records or their window).

    Returns:
        The events, metadata first, then ``X`` events sorted by time.
    """
    g, a, m = records.gpu, records.api, records.markers
    starts = [x.min() for x in (g.start, a.start, m.start) if x.size]
    if t0 is None:
        candidates = [int(s) for s in starts]
        if records.window is not None:
            candidates.append(int(records.window[0]))
        t0 = min(candidates) if candidates else 0

    meta: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []

    # GPU side
    for dev in sorted({int(d) for d in g.device}):
        pid = GPU_PID_BASE + dev
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"GPU {dev}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": dev}})
        for stream in sorted({int(s) for s in g.stream[g.device == dev]}):
            meta.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": stream, "args": {"name": f"stream {stream}"}}
            )
    first_gpu: dict[tuple[int, int], tuple[int, int, int]] = {}
    for i in range(len(g)):
        kind = int(g.kind[i])
        dev, stream, corr = int(g.device[i]), int(g.stream[i]), int(g.correlation[i])
        if kind == act.KERNEL:
            name, cat = str(g.name[i]) or "kernel", "kernel"
        elif kind == act.MEMCPY:
            name, cat = _copy_name(int(g.copy_kind[i]), int(g.bytes[i])), "memcpy"
        elif kind == act.MEMSET:
            name, cat = f"memset {int(g.bytes[i]):,} B", "memset"
        else:
            name, cat = "graph", "graph"
        args: dict[str, Any] = {"correlation": corr}
        if kind in (act.MEMCPY, act.MEMSET):
            args["bytes"] = int(g.bytes[i])
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": cat,
                "pid": GPU_PID_BASE + dev,
                "tid": stream,
                "ts": _us(g.start[i], t0),
                "dur": (int(g.end[i]) - int(g.start[i])) / 1e3,
                "args": args,
            }
        )
        key = (int(g.process[i]), corr)
        if corr and (key not in first_gpu or int(g.start[i]) < first_gpu[key][0]):
            first_gpu[key] = (int(g.start[i]), GPU_PID_BASE + dev, stream)

    # host side
    threads: dict[tuple[int, int], None] = {}
    for p, t in zip(a.process.tolist(), a.thread.tolist(), strict=True):
        threads[(int(p), int(t))] = None
    for p, t in zip(m.process.tolist(), m.thread.tolist(), strict=True):
        threads[(int(p), int(t))] = None
    for pid in sorted({p for p, _ in threads}):
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"host process {pid}"}})
    for pid, tid in sorted(threads):
        label = records.thread_names.get(tid)
        meta.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": tid,
                "args": {"name": f"{label} ({tid})" if label else f"thread {tid}"},
            }
        )
    sync = a.is_in(act.SYNC_APIS)
    launch = a.is_in(act.LAUNCH_APIS)
    copy = a.is_copy()
    for i in range(len(a)):
        cat = "sync" if sync[i] else "launch" if launch[i] else "memcpy_api" if copy[i] else "cuda_api"
        pid, tid, corr = int(a.process[i]), int(a.thread[i]), int(a.correlation[i])
        events.append(
            {
                "ph": "X",
                "name": str(a.name[i]),
                "cat": cat,
                "pid": pid,
                "tid": tid,
                "ts": _us(a.start[i], t0),
                "dur": (int(a.end[i]) - int(a.start[i])) / 1e3,
                "args": {"correlation": corr, "api": "runtime" if int(a.domain[i]) == act.RUNTIME else "driver"},
            }
        )
        # GPU work and API calls meet on (process, correlation id): correlation ids are per process.
        target = first_gpu.get((pid, corr)) if flows and launch[i] and corr else None
        if target is not None:
            fid = f"{pid}:{corr}"
            events.append(
                {
                    "ph": "s",
                    "id": fid,
                    "name": "launch",
                    "cat": "flow",
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(a.start[i], t0),
                }
            )
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "id": fid,
                    "name": "launch",
                    "cat": "flow",
                    "pid": target[1],
                    "tid": target[2],
                    "ts": _us(target[0], t0),
                }
            )
    for i in range(len(m)):
        s, e = int(m.start[i]), int(m.end[i])
        base = {
            "name": str(m.name[i]),
            "cat": "nvtx",
            "pid": int(m.process[i]),
            "tid": int(m.thread[i]),
            "ts": _us(s, t0),
        }
        if e > s:
            events.append({"ph": "X", "dur": (e - s) / 1e3, **base})
        else:
            events.append({"ph": "i", "s": "t", **base})
    events.sort(key=lambda ev: (ev["ts"], 0 if ev["ph"] == "X" else 1))
    return meta + events


def to_trace(records: Records, *, flows: bool = True) -> dict[str, Any]:
    """The whole trace document: ``{"traceEvents": [...], "displayTimeUnit": "ns", ...}``.

    Args:
        records: The collection.
        flows: Add launch -> GPU flow arrows.

    Returns:
        A JSON-ready dict.
    """
    events = trace_events(records, flows=flows)
    starts = [int(x.min()) for x in (records.gpu.start, records.api.start, records.markers.start) if x.size]
    if records.window is not None:
        starts.append(int(records.window[0]))
    other: dict[str, Any] = {"source": "inflight.profiling", "t0_ns": min(starts) if starts else 0}
    if records.window is not None:
        other["window_ns"] = list(records.window)
    if records.notes:
        other["notes"] = list(records.notes)
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def write_trace(records: Records, path: str | Path, *, flows: bool = True) -> Path:
    """Write the trace JSON (``.json``; ``.json.gz`` is gzip-compressed).

    Args:
        records: The collection.
        path: Output file.
        flows: Add launch -> GPU flow arrows.

    Returns:
        The path written.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = json.dumps(to_trace(records, flows=flows), separators=(",", ":"), default=_default)
    if out.name.endswith(".gz"):
        import gzip

        with gzip.open(out, "wt", encoding="utf-8") as f:
            f.write(doc)
    else:
        out.write_text(doc, encoding="utf-8")
    LOGGER.info(
        "trace: %s (%d GPU ops, %d API calls); open it in https://ui.perfetto.dev",
        out,
        len(records.gpu),
        len(records.api),
    )
    return out


def _default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
