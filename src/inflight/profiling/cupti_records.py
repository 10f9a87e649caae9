"""cupti-python's activity records reduced to the columns of :mod:`~inflight.profiling.activity`.

The CUPTI constants this package relies on (activity kinds, marker flags, the callback ids of
the calls the figures classify), :class:`CbidNames` (a callback id's base API name),
:func:`reduce_activities` (one CUPTI buffer to a :class:`Batch`, in CUPTI's callback thread) and
:func:`pair_markers` (NVTX marker events to ranges). Nothing here imports cupti-python: the
records are read through the attribute names of its ``Activity*`` classes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inflight.profiling import activity as act
from inflight.profiling.activity import ApiCalls, GpuOps, Ranges

# CUpti_ActivityKind values (cupti_activity.h; identical in cupti-python 13.4's ActivityKind).
K_MEMCPY = 1
K_MEMSET = 2
K_KERNEL = 3
K_DRIVER = 4
K_RUNTIME = 5
K_CONCURRENT_KERNEL = 10
K_MARKER = 12
K_GRAPH_TRACE = 51

# CUpti_ActivityFlag marker bits (cupti_activity.h). The Python enum has no MARKER_END member
# because 1 << 2 aliases nothing it keeps; the C header defines CUPTI_ACTIVITY_FLAG_MARKER_END.
MARKER_INSTANTANEOUS = 1 << 0
MARKER_START = 1 << 1
MARKER_END = 1 << 2

#: (domain, cbid) -> base name for the calls the figures classify, used when cupti cannot name
#: a cbid. Values from cupti-python 13.4 ``RuntimeApiTraceCbid`` / ``DriverApiTraceCbid``
#: (cupti_runtime_cbid.h / cupti_driver_cbid.h; cbids are never renumbered).
FALLBACK_CBID_NAMES: dict[tuple[int, int], str] = {
    **{
        (act.RUNTIME, c): n
        for c, n in {
            126: "cudaThreadSynchronize",
            131: "cudaStreamSynchronize",
            137: "cudaEventSynchronize",
            165: "cudaDeviceSynchronize",
            211: "cudaLaunchKernel",
            214: "cudaLaunchKernel",
            239: "cudaStreamSynchronize",
            269: "cudaLaunchCooperativeKernel",
            270: "cudaLaunchCooperativeKernel",
            272: "cudaLaunchCooperativeKernelMultiDevice",
            311: "cudaGraphLaunch",
            312: "cudaGraphLaunch",
            430: "cudaLaunchKernelExC",
            431: "cudaLaunchKernelExC",
            534: "cudaExecutionCtxSynchronize",
        }.items()
    },
    **{
        (act.DRIVER, c): n
        for c, n in {
            17: "cuCtxSynchronize",
            116: "cuLaunchGrid",
            117: "cuLaunchGridAsync",
            121: "cuEventSynchronize",
            126: "cuStreamSynchronize",
            307: "cuLaunchKernel",
            440: "cuStreamSynchronize",
            442: "cuLaunchKernel",
            477: "cuLaunchCooperativeKernel",
            478: "cuLaunchCooperativeKernel",
            480: "cuLaunchCooperativeKernelMultiDevice",
            514: "cuGraphLaunch",
            515: "cuGraphLaunch",
            652: "cuLaunchKernelEx",
            653: "cuLaunchKernelEx",
            800: "cuCtxSynchronize",
        }.items()
    },
}


class CbidNames:
    """Base names of (domain, cbid) pairs, resolved once each and cached.

    Args:
        cupti: The ``cupti.cupti`` module, or None to use :data:`FALLBACK_CBID_NAMES` only.
    """

    def __init__(self, cupti: Any = None) -> None:
        self._cupti = cupti
        self._cache: dict[tuple[int, int], str] = {}

    def __call__(self, domain: int, cbid: int) -> str:
        """Base name of ``cbid`` in ``domain`` (``RUNTIME`` or ``DRIVER``)."""
        key = (domain, cbid)
        name = self._cache.get(key)
        if name is None:
            name = self._cache[key] = self._resolve(domain, cbid)
        return name

    def _resolve(self, domain: int, cbid: int) -> str:
        c = self._cupti
        if c is not None:
            try:
                cb_domain = c.CallbackDomain.RUNTIME_API if domain == act.RUNTIME else c.CallbackDomain.DRIVER_API
                raw = c.get_callback_name(cb_domain, cbid)
                if raw:
                    return act.api_base_name(raw.decode() if isinstance(raw, bytes) else str(raw))
            except Exception:  # fall back to the enum, then to the table
                pass
            try:
                enum = c.RuntimeApiTraceCbid if domain == act.RUNTIME else c.DriverApiTraceCbid
                return act.api_base_name(enum(cbid).name)
            except Exception:
                pass
        fallback = FALLBACK_CBID_NAMES.get((domain, cbid))
        return fallback or f"{'cuda' if domain == act.RUNTIME else 'cu'}#cbid{cbid}"


@dataclass
class Batch:
    """One CUPTI buffer, reduced to columns.

    Attributes:
        gpu: Kernels, copies, memsets, graph executions with valid timestamps.
        api: Runtime and driver calls with valid timestamps.
        markers: Raw NVTX marker events ``(id, flags, timestamp, name, process, thread)``.
        dropped: Records without usable timestamps (incomplete at a forced flush).
    """

    gpu: GpuOps
    api: ApiCalls
    markers: list[tuple[int, int, int, str, int, int]] = field(default_factory=list)
    dropped: int = 0


def reduce_activities(
    activities: Iterable[Any], names: Callable[[int, int], str], *, kernel_names: bool = False
) -> Batch:
    """Turn cupti-python activity objects into columns (runs in the CUPTI callback thread).

    Only plain numbers and strings are kept, so nothing refers to CUPTI's buffer afterwards.

    Args:
        activities: The objects handed to the buffer-completed callback.
        names: ``(domain, cbid) -> base API name``.
        kernel_names: Keep kernel names (costs a string per kernel).

    Returns:
        The batch.
    """
    g_kind: list[int] = []
    g_cols: list[tuple[int, int, int, int, int, int, int]] = []
    g_name: list[str] = []
    a_dom: list[int] = []
    a_cols: list[tuple[int, int, int, int, int]] = []
    a_name: list[str] = []
    markers: list[tuple[int, int, int, str, int, int]] = []
    dropped = 0
    for a in activities:
        k = int(a.kind)
        if k in (K_CONCURRENT_KERNEL, K_KERNEL, K_MEMCPY, K_MEMSET, K_GRAPH_TRACE):
            s, e = int(a.start), int(a.end)
            if s <= 0 or e <= s:
                dropped += 1
                continue
            if k == K_MEMCPY:
                gk, nbytes, ck = act.MEMCPY, int(a.bytes), int(a.copy_kind)
            elif k == K_MEMSET:
                gk, nbytes, ck = act.MEMSET, int(a.bytes), 0
            elif k == K_GRAPH_TRACE:
                gk, nbytes, ck = act.GRAPH, 0, 0
            else:
                gk, nbytes, ck = act.KERNEL, 0, 0
            g_kind.append(gk)
            g_cols.append((s, e, int(a.device_id), int(a.stream_id), int(a.correlation_id), nbytes, ck))
            g_name.append(str(a.name) if kernel_names and gk == act.KERNEL else "")
        elif k in (K_RUNTIME, K_DRIVER):
            s, e = int(a.start), int(a.end)
            if s <= 0 or e < s:
                dropped += 1
                continue
            dom = act.RUNTIME if k == K_RUNTIME else act.DRIVER
            a_dom.append(dom)
            a_cols.append((s, e, int(a.process_id), int(a.thread_id), int(a.correlation_id)))
            a_name.append(names(dom, int(a.cbid)))
        elif k == K_MARKER:
            proc = tid = 0
            try:
                proc = int(a.object_id.pt.process_id)
                tid = int(a.object_id.pt.thread_id)
            except AttributeError:
                pass
            markers.append((int(a.id), int(a.flags_), int(a.timestamp), str(a.name or ""), proc, tid))
    if g_cols:
        ga = np.asarray(g_cols, dtype=np.int64)
        gpu = GpuOps.from_columns(
            kind=np.asarray(g_kind, dtype=np.int8),
            start=ga[:, 0],
            end=ga[:, 1],
            device=ga[:, 2],
            stream=ga[:, 3],
            correlation=ga[:, 4],
            process=np.full(len(ga), os.getpid(), dtype=np.int64),
            bytes=ga[:, 5],
            copy_kind=ga[:, 6],
            name=g_name,
        )
    else:
        gpu = GpuOps.empty()
    if a_cols:
        aa = np.asarray(a_cols, dtype=np.int64)
        names_arr = np.empty(len(a_name), dtype=object)
        names_arr[:] = a_name
        api = ApiCalls(
            domain=np.asarray(a_dom, dtype=np.int8),
            start=aa[:, 0],
            end=aa[:, 1],
            process=aa[:, 2],
            thread=aa[:, 3],
            correlation=aa[:, 4],
            name=names_arr,
        )
    else:
        api = ApiCalls.empty()
    return Batch(gpu=gpu, api=api, markers=markers, dropped=dropped)


def pair_markers(events: Iterable[tuple[int, int, int, str, int, int]], *, close_at: int | None = None) -> Ranges:
    """Pair NVTX marker start/end events by id into ranges; instantaneous marks get zero length.

    Args:
        events: ``(id, flags, timestamp, name, process, thread)`` as in :class:`Batch`.
        close_at: End time for ranges still open (None: drop them).

    Returns:
        The ranges, sorted by start.
    """
    open_: dict[int, tuple[int, str, int, int]] = {}
    rows: list[tuple[int, int, str, int, int]] = []
    for mid, flags, ts, name, proc, tid in sorted(events, key=lambda ev: ev[2]):
        if flags & MARKER_INSTANTANEOUS:
            rows.append((ts, ts, name, proc, tid))
        elif flags & MARKER_START:
            open_[mid] = (ts, name, proc, tid)
        elif flags & MARKER_END and mid in open_:
            s, n, p, t = open_.pop(mid)
            rows.append((s, ts, n, p, t))
    if close_at is not None:
        rows.extend((s, max(close_at, s), n, p, t) for s, n, p, t in open_.values())
    rows.sort(key=lambda r: r[0])
    return Ranges.from_columns(
        start=[r[0] for r in rows],
        end=[r[1] for r in rows],
        name=[r[2] for r in rows],
        process=[r[3] for r in rows],
        thread=[r[4] for r in rows],
    )
