"""In-process GPU activity measurement with cupti-python's Activity API.

Three entry points share one process-wide CUPTI owner (:class:`_Hub`):

* :class:`LiveGpuMetrics` -- rolling-window figures for Triton's metrics endpoint.
  ``LiveGpuMetrics.start(window_s=1.0)`` enables CONCURRENT_KERNEL, MEMCPY, MEMSET, RUNTIME and
  DRIVER records and flushes CUPTI's buffers every ``window_s / 4``; the buffer-completed
  callback reduces each buffer to merged GPU intervals and API-call spans *in the CUPTI
  callback thread*, and the flusher thread recomputes the figures after each flush.
  ``figures()`` only copies the latest snapshot under a lock, so it is cheap enough for the
  execute thread: ``{"gpu_activity", "sync_share", "kernels", "window_s"}``.
* :class:`CuptiWindow` -- ``with CuptiWindow() as w: ...`` keeps every record of the block;
  ``w.gpu_activity()``, ``w.sync_share()``, ``w.sync_calls_by_thread()``, ``w.summary()`` and
  ``w.write_trace(path)`` (Perfetto JSON, :mod:`~inflight.profiling.trace`) read them.
* :func:`collect` -- ``collect(duration_s)`` records whatever the process runs for a while.

**Thread ids.** CUPTI is told to use ``CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM``
(``cupti.set_thread_id_type(ActivityThreadIdType.SYSTEM)``), so the ``threadId`` of RUNTIME and
DRIVER records is the kernel thread id, ``gettid()``. On Linux that is exactly
``threading.get_native_id()`` (and ``threading.Thread.native_id``), the id ``ps -L``, ``top -H``
and nsys show. With the DEFAULT type CUPTI would report ``pthread_self()`` truncated to 32 bits,
which matches nothing in Python; if setting SYSTEM fails, :attr:`CuptiWindow.thread_id_type`
says so and :meth:`CuptiWindow.sync_calls_by_thread` should not be compared with native ids.

**Timestamps** are CUPTI's (``cupti.get_timestamp()``, ns); windows are taken on that clock.

**Caveats.** Forced flushes (the default; ``cupti.activity_flush_all(1)``) hand over buffers
that still hold records of work in flight; those come back with zero timestamps and are dropped
(counted in ``dropped``), so live figures can miss a kernel per stream at each flush boundary.
The Python object CUPTI builds per record costs microseconds of GIL time: at tens of thousands
of kernels per second this is visible; measure with it on and off. CUDA 13.2 and older drivers
allow a single CUPTI subscriber per process: under nsys (or torch.profiler) enabling fails and
:class:`CuptiUnavailableError` says why. NVTX ranges reach CUPTI (MARKER records) only when
``NVTX_INJECTION64_PATH`` names libcupti before the process makes its first NVTX call; see
:func:`cupti_library_path`. Seen on the H200 (CUPTI 13): ``torch.cuda.nvtx`` ranges and marks
arrive (with the caller's native thread id); ranges of the ``nvtx`` package's ``annotate()`` did
not, although nsys records them.

**Driver records.** Torch launches its kernels with ``cuLaunchKernel`` and resolves entry points
with ``cuGetProcAddress``: on the H200 a 20-matmul window held ~1400 DRIVER records next to ~300
RUNTIME ones, none nested in a runtime call. Both domains are enabled by default; the figures
drop a driver call only when it lies inside a runtime call of the same thread
(:meth:`ApiCalls.outermost <inflight.profiling.activity.ApiCalls.outermost>`).

cupti-python is imported lazily (``pip install cupti-python pyelftools``), so importing this
module needs no GPU.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inflight.profiling import activity as act
from inflight.profiling import figures as fig
from inflight.profiling import intervals as iv
from inflight.profiling import regime
from inflight.profiling.activity import ApiCalls, GpuOps, Ranges, Records
from inflight.profiling.regime import ActivitySummary
from inflight.tool_errors import CuptiUnavailableError

LOGGER = logging.getLogger(__name__)

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


def import_cupti() -> Any:
    """The ``cupti.cupti`` module of cupti-python.

    Raises:
        CuptiUnavailableError: when it is not installed or cannot load.
    """
    try:
        from cupti import cupti
    except ImportError as e:
        raise CuptiUnavailableError(
            f"cupti-python is not importable ({e}); `pip install cupti-python pyelftools` (or 'inflight[profiling]')"
        ) from None
    return cupti


def cupti_library_path() -> str | None:
    """Path of libcupti (for ``NVTX_INJECTION64_PATH``), found the way cupti-python finds it.

    Returns:
        The absolute path, or None when it cannot be located.
    """
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = getattr(load_nvidia_dynamic_lib("cupti"), "abs_path", None)
        return str(path) if path else None
    except Exception as e:  # pathfinder raises several error types; any means "not found"
        LOGGER.debug("libcupti not located: %s", e)
        return None


# -- naming API calls ---------------------------------------------------------------------------


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


# -- reducing CUPTI records -----------------------------------------------------------------------


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


# -- rolling window (live metrics) ----------------------------------------------------------------


@dataclass
class _Chunk:
    t_min: int
    t_max: int
    gpu_s: Any
    gpu_e: Any
    kernel_starts: Any
    api_s: Any
    api_e: Any
    api_sync: Any


class RollingWindow:
    """Figures over the last ``window_ns`` of reduced batches; thread-safe.

    :meth:`add` (CUPTI callback thread) stores each batch as merged GPU intervals, kernel
    start times and API-call spans; :meth:`advance` (flusher thread) drops what fell out of the
    window and recomputes the snapshot; :meth:`snapshot` (any thread) copies it.

    Args:
        window_ns: Window length.
        device: Only this device's GPU work (None: all devices, merged).
        origin_ns: Collection start; early windows begin here instead of before it.
    """

    def __init__(self, window_ns: int, *, device: int | None = None, origin_ns: int | None = None) -> None:
        if window_ns <= 0:
            raise ValueError(f"window must be positive (got {window_ns} ns)")
        self.window_ns = int(window_ns)
        self.device = device
        self.origin_ns = origin_ns
        self.dropped = 0
        self._chunks: deque[_Chunk] = deque()
        self._lock = threading.Lock()
        self._snapshot: dict[str, float] | None = None

    def add(self, batch: Batch) -> None:
        """Store one batch (reduced to intervals here, in the caller's thread)."""
        gpu = batch.gpu
        if self.device is not None and len(gpu):
            gpu = gpu.select(gpu.device == self.device)
        gs, ge = iv.union(gpu.start, gpu.end)
        ks = np.sort(gpu.start[gpu.kind == act.KERNEL])
        api = batch.api.select(batch.api.outermost()) if len(batch.api) else batch.api
        sync = api.is_in(act.SYNC_APIS)
        times = [x for x in (gs[:1], ge[-1:], api.start, api.end) if x.size]
        if not times and not batch.dropped:
            return
        allt = np.concatenate(times) if times else np.zeros(1, dtype=np.int64)
        chunk = _Chunk(int(allt.min()), int(allt.max()), gs, ge, ks, api.start, api.end, sync)
        with self._lock:
            self.dropped += batch.dropped
            if times:
                self._chunks.append(chunk)

    def advance(self, now_ns: int) -> dict[str, float]:
        """Recompute the figures for ``[now - window, now)`` and publish them.

        Args:
            now_ns: The current CUPTI timestamp.

        Returns:
            The new snapshot.
        """
        hi = int(now_ns)
        lo = hi - self.window_ns
        if self.origin_ns is not None:
            lo = max(lo, min(self.origin_ns, hi))
        with self._lock:
            while self._chunks and self._chunks[0].t_max < lo:
                self._chunks.popleft()
            chunks = [c for c in self._chunks if c.t_max >= lo]
        figures = self.compute(chunks, lo, hi)
        with self._lock:
            self._snapshot = figures
        return figures

    @staticmethod
    def compute(chunks: list[_Chunk], lo: int, hi: int) -> dict[str, float]:
        """Figures over ``[lo, hi)`` from stored chunks."""
        wall = max(hi - lo, 0)
        if not chunks or wall == 0:
            return {"gpu_activity": 0.0, "sync_share": 0.0, "kernels": 0.0, "window_s": wall / 1e9}
        gs = np.concatenate([c.gpu_s for c in chunks])
        ge = np.concatenate([c.gpu_e for c in chunks])
        busy = iv.busy_fraction(gs, ge, lo, hi)
        ks = np.concatenate([c.kernel_starts for c in chunks])
        kernels = int(((ks >= lo) & (ks < hi)).sum())
        a_s = np.concatenate([c.api_s for c in chunks])
        a_e = np.concatenate([c.api_e for c in chunks])
        sync = np.concatenate([c.api_sync for c in chunks])
        dur = fig.clipped_durations(a_s, a_e, lo, hi)
        total = int(dur.sum())
        share = int(dur[sync].sum()) / total if total else 0.0
        return {"gpu_activity": busy, "sync_share": share, "kernels": float(kernels), "window_s": wall / 1e9}

    def snapshot(self) -> dict[str, float] | None:
        """A copy of the latest figures, or None before the first :meth:`advance`."""
        with self._lock:
            return None if self._snapshot is None else dict(self._snapshot)


# -- the process-wide CUPTI owner -----------------------------------------------------------------


class _Subscriber:
    """What the hub needs from a consumer (duck-typed)."""

    kinds: frozenset[int]
    periodic: bool
    kernel_names: bool

    def on_batch(self, batch: Batch) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def on_tick(self, now_ns: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class _Hub:
    """Owns CUPTI's activity state for the process: callbacks, enabled kinds, the flusher.

    CUPTI's activity callbacks and enabled kinds are process-global, so consumers subscribe
    here; each gets every reduced batch. Kinds are enabled while at least one subscriber wants
    them; one flusher thread runs while a periodic subscriber exists.

    Args:
        buffer_bytes: Size of each activity buffer handed to CUPTI.
        force_flush: Periodic flushes use ``CUPTI_ACTIVITY_FLAG_FLUSH_FORCED``.
    """

    def __init__(self, buffer_bytes: int = 4 << 20, force_flush: bool = True) -> None:
        self.buffer_bytes = int(buffer_bytes)
        self.force_flush = force_flush
        self._lock = threading.RLock()
        self._subs: list[Any] = []
        self._enabled: dict[int, int] = {}
        self._cupti: Any = None
        self._names: CbidNames | None = None
        self._registered = False
        self.thread_id_type = "unknown"
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        self._interval_s = 0.25

    # CUPTI is imported and configured on first use only.
    def _ensure(self) -> Any:
        if self._cupti is not None:
            return self._cupti
        c = import_cupti()
        for name, value in (("MEMCPY", K_MEMCPY), ("KERNEL", K_KERNEL), ("RUNTIME", K_RUNTIME), ("MARKER", K_MARKER)):
            if int(getattr(c.ActivityKind, name)) != value:
                LOGGER.warning(
                    "cupti ActivityKind.%s is %s, expected %s", name, int(getattr(c.ActivityKind, name)), value
                )
        try:
            c.set_thread_id_type(c.ActivityThreadIdType.SYSTEM)
            self.thread_id_type = "system"
        except Exception as e:  # records then carry pthread_self() ids
            self.thread_id_type = "default"
            LOGGER.warning("CUPTI thread ids stay pthread_self()-based (set_thread_id_type failed: %s)", e)
        try:
            c.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        except Exception as e:
            raise CuptiUnavailableError(
                f"CUPTI refused the activity callbacks ({e}); is another profiler (nsys, torch.profiler) attached?"
            ) from None
        self._registered = True
        self._names = CbidNames(c)
        self._cupti = c
        return c

    def timestamp(self) -> int:
        """CUPTI's current timestamp, ns."""
        return int(self._ensure().get_timestamp())

    def subscribe(self, sub: Any) -> None:
        """Enable ``sub.kinds`` and start delivering batches to ``sub``.

        Raises:
            CuptiUnavailableError: when CUPTI refuses a kind (another profiler, no GPU).
        """
        with self._lock:
            c = self._ensure()
            counted: list[int] = []
            newly: list[int] = []
            for k in sorted(sub.kinds):
                try:
                    if self._enabled.get(k, 0) == 0:
                        c.activity_enable(k)
                        newly.append(k)
                except Exception as e:
                    self._rollback(counted, newly)
                    raise CuptiUnavailableError(
                        f"CUPTI could not enable activity kind {k} ({e}); with a CUDA 13.2-or-older driver only one "
                        "CUPTI subscriber may run per process (nsys, torch.profiler and this module exclude each other)"
                    ) from None
                self._enabled[k] = self._enabled.get(k, 0) + 1
                counted.append(k)
            self._subs.append(sub)
            if sub.periodic:
                self._start_flusher()

    def _rollback(self, counted: list[int], newly: list[int]) -> None:
        for k in counted:
            self._enabled[k] -= 1
            if self._enabled[k] <= 0:
                del self._enabled[k]
        for k in newly:
            try:
                self._cupti.activity_disable(k)
            except Exception as e:
                LOGGER.debug("activity_disable(%s) during rollback: %s", k, e)

    def unsubscribe(self, sub: Any, *, flush: bool = True) -> None:
        """Deliver what CUPTI holds, then stop delivering to ``sub`` and release its kinds."""
        if flush:
            self.flush(force=True)
        with self._lock:
            if sub not in self._subs:
                return
            self._subs.remove(sub)
            gone: list[int] = []
            for k in sub.kinds:
                self._enabled[k] -= 1
                if self._enabled[k] <= 0:
                    del self._enabled[k]
                    gone.append(k)
            for k in gone:
                try:
                    self._cupti.activity_disable(k)
                except Exception as e:
                    LOGGER.debug("activity_disable(%s): %s", k, e)
            stop_flusher = not any(s.periodic for s in self._subs)
        if stop_flusher:
            self._stop_flusher()
        if gone and flush:
            self.flush(force=True)  # drain records of the kinds just disabled

    def flush(self, *, force: bool) -> None:
        """``cupti.activity_flush_all``; the completed callback runs before this returns.

        The hub lock is *not* held here: CUPTI may call back from its own thread.
        """
        c = self._cupti
        if c is None:
            return
        try:
            c.activity_flush_all(1 if force else 0)
        except Exception as e:
            LOGGER.warning("cupti.activity_flush_all failed: %s", e)

    # -- CUPTI callbacks (CUPTI's thread or the flushing thread) --------------------------------
    def _buffer_requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0

    def _buffer_completed(self, activities: Any) -> None:
        try:
            with self._lock:
                subs = list(self._subs)
            if not subs:
                return
            names = self._names or CbidNames(None)
            batch = reduce_activities(activities, names, kernel_names=any(s.kernel_names for s in subs))
            for s in subs:
                try:
                    s.on_batch(batch)
                except Exception:
                    LOGGER.exception("CUPTI consumer %r failed on a batch", s)
        except Exception:  # never let an exception escape into CUPTI
            LOGGER.exception("CUPTI buffer-completed callback failed")

    # -- periodic flushing ---------------------------------------------------------------------
    def _start_flusher(self) -> None:
        intervals = [s.interval_s for s in self._subs if s.periodic]
        self._interval_s = min(intervals) if intervals else 0.25
        if self._flusher is not None and self._flusher.is_alive():
            return
        self._stop.clear()
        self._flusher = threading.Thread(target=self._flush_loop, name="inflight-cupti-flush", daemon=True)
        self._flusher.start()

    def _stop_flusher(self) -> None:
        t = self._flusher
        if t is None:
            return
        self._stop.set()
        if t is not threading.current_thread():
            t.join(timeout=5.0)
        self._flusher = None

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                now = int(self._cupti.get_timestamp())
                self.flush(force=self.force_flush)
                with self._lock:
                    subs = [s for s in self._subs if s.periodic]
                for s in subs:
                    s.on_tick(now)
            except Exception:
                LOGGER.exception("CUPTI flusher iteration failed")


_HUB_LOCK = threading.Lock()
_HUB: _Hub | None = None


def hub() -> _Hub:
    """The process-wide CUPTI owner (created on first use, CUPTI imported then)."""
    global _HUB
    with _HUB_LOCK:
        if _HUB is None:
            _HUB = _Hub()
        return _HUB


LIVE_KINDS = frozenset({K_CONCURRENT_KERNEL, K_MEMCPY, K_MEMSET, K_RUNTIME, K_DRIVER})


class LiveGpuMetrics:
    """Rolling-window GPU activity and sync share for one process (e.g. a Triton stub).

    Use :meth:`start`; call :meth:`figures` as often as you like (it copies a snapshot);
    call :meth:`stop` when done.

    Args:
        window_s: Length of the rolling window.
        device: Only this GPU (None: every device the process uses, merged).
        flush_interval_s: How often CUPTI's buffers are flushed and the figures recomputed
            (default ``window_s / 4``).
        hub_: The CUPTI owner (tests inject a fake).
    """

    def __init__(
        self,
        window_s: float = 1.0,
        *,
        device: int | None = None,
        flush_interval_s: float | None = None,
        hub_: Any = None,
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive (got {window_s})")
        self.window_s = float(window_s)
        self.kinds = LIVE_KINDS
        self.periodic = True
        self.kernel_names = False
        self.interval_s = float(flush_interval_s) if flush_interval_s else self.window_s / 4
        self._hub = hub_
        self._window = RollingWindow(int(self.window_s * 1e9), device=device)
        self._running = False

    @classmethod
    def start(cls, window_s: float = 1.0, **kwargs: Any) -> LiveGpuMetrics:
        """Create and start collecting.

        Args:
            window_s: Length of the rolling window.
            **kwargs: Passed to the constructor.

        Returns:
            The running collector.

        Raises:
            CuptiUnavailableError: when CUPTI cannot be used in this process.
        """
        m = cls(window_s, **kwargs)
        m._start()
        return m

    def _start(self) -> None:
        h = self._hub or hub()
        self._hub = h
        self._window.origin_ns = h.timestamp()
        h.subscribe(self)
        self._running = True
        LOGGER.info("live CUPTI metrics on: %.2f s window, flushed every %.2f s", self.window_s, self.interval_s)

    def figures(self) -> dict[str, float] | None:
        """``{"gpu_activity", "sync_share", "kernels", "window_s"}`` of the latest window, or None yet."""
        return self._window.snapshot()

    @property
    def dropped(self) -> int:
        """Records dropped for lack of timestamps (in flight at a forced flush)."""
        return self._window.dropped

    def stop(self) -> None:
        """Stop collecting (idempotent)."""
        if not self._running:
            return
        self._running = False
        try:
            self._hub.unsubscribe(self, flush=False)
        finally:
            LOGGER.info("live CUPTI metrics off (%d incomplete records dropped)", self.dropped)

    # hub callbacks
    def on_batch(self, batch: Batch) -> None:
        """Reduce and store one batch (CUPTI callback thread)."""
        self._window.add(batch)

    def on_tick(self, now_ns: int) -> None:
        """Recompute the figures after a flush (flusher thread)."""
        self._window.advance(now_ns)

    def __enter__(self) -> LiveGpuMetrics:
        if not self._running:
            self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        if getattr(self, "_running", False):
            warnings.warn(
                "LiveGpuMetrics was started but never stopped; CUPTI keeps tracing (call stop())",
                ResourceWarning,
                stacklevel=1,
            )


class CuptiWindow:
    """Record CUDA activity of a ``with`` block and compute figures over it.

    ``with CuptiWindow() as w: run()`` then ``w.gpu_activity()``, ``w.sync_share()``,
    ``w.sync_calls_by_thread()`` (OS thread id -> number of ``*Synchronize`` calls; ids are
    ``threading.get_native_id()`` values, see the module docstring), ``w.summary()``,
    ``w.write_trace(path)``. The window runs from entering to leaving the block on CUPTI's clock;
    leaving forces a flush, so all work that *finished* inside the block is seen (synchronise
    at the end of the block if the last work must count).

    Args:
        kernels: Record kernels (CONCURRENT_KERNEL).
        memcpy: Record copies.
        memset: Record memsets.
        runtime: Record runtime API calls.
        driver: Record driver API calls.
        graph_trace: Record whole CUDA graph executions (GRAPH_TRACE) instead of their kernels.
        markers: Record NVTX ranges (MARKER; needs ``NVTX_INJECTION64_PATH``, see
            :func:`cupti_library_path`).
        kernel_names: Keep kernel names (for traces).
        hub_: The CUPTI owner (tests inject a fake).
    """

    def __init__(
        self,
        *,
        kernels: bool = True,
        memcpy: bool = True,
        memset: bool = True,
        runtime: bool = True,
        driver: bool = True,
        graph_trace: bool = False,
        markers: bool = False,
        kernel_names: bool = True,
        hub_: Any = None,
    ) -> None:
        wanted = {
            K_CONCURRENT_KERNEL: kernels,
            K_MEMCPY: memcpy,
            K_MEMSET: memset,
            K_RUNTIME: runtime,
            K_DRIVER: driver,
            K_GRAPH_TRACE: graph_trace,
            K_MARKER: markers,
        }
        self.kinds = frozenset(k for k, on in wanted.items() if on)
        self.periodic = False
        self.interval_s = 0.0
        self.kernel_names = kernel_names
        if hub_ is None:
            import_cupti()  # fail here, at construction, when cupti-python is missing
        self._hub = hub_
        self._lock = threading.Lock()
        self._gpu: list[GpuOps] = []
        self._api: list[ApiCalls] = []
        self._markers: list[tuple[int, int, int, str, int, int]] = []
        self.dropped = 0
        self.t0: int | None = None
        self.t1: int | None = None
        self.thread_names: dict[int, str] = {}
        self.thread_id_type = "unknown"
        self._records: Records | None = None

    def __enter__(self) -> CuptiWindow:
        h = self._hub or hub()
        self._hub = h
        if K_MARKER in self.kinds and not os.environ.get("NVTX_INJECTION64_PATH"):
            LOGGER.warning(
                "markers=True but NVTX_INJECTION64_PATH is unset: NVTX ranges will not reach CUPTI; start the process "
                "with NVTX_INJECTION64_PATH=%s",
                cupti_library_path() or "<path to libcupti.so>",
            )
        h.subscribe(self)
        self.thread_id_type = getattr(h, "thread_id_type", "unknown")
        self.t0 = h.timestamp()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hub is None:
            raise RuntimeError("CuptiWindow.__exit__ without __enter__; use it as `with CuptiWindow() as w:`")
        self.t1 = self._hub.timestamp()
        self.thread_names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        self._hub.unsubscribe(self, flush=True)
        self._records = None

    def on_batch(self, batch: Batch) -> None:
        """Keep one batch (CUPTI callback thread)."""
        api = batch.api
        if K_DRIVER not in self.kinds and len(api):
            api = api.select(api.domain != act.DRIVER)
        with self._lock:
            self._gpu.append(batch.gpu)
            self._api.append(api)
            self._markers.extend(batch.markers)
            self.dropped += batch.dropped

    def on_tick(self, now_ns: int) -> None:
        """Unused (not periodic)."""

    @property
    def window(self) -> tuple[int, int]:
        """``(t0, t1)`` on CUPTI's clock.

        Raises:
            RuntimeError: before the block has finished.
        """
        if self.t0 is None or self.t1 is None:
            raise RuntimeError("the CuptiWindow has not finished yet; read figures after the with-block")
        return self.t0, self.t1

    @property
    def records(self) -> Records:
        """Everything recorded inside the window."""
        if self._records is None:
            with self._lock:
                gpu = GpuOps.concat(self._gpu)
                api = ApiCalls.concat(self._api)
                marks = list(self._markers)
            t0, t1 = self.window
            notes = [f"{self.dropped} CUPTI records dropped (no timestamps)"] if self.dropped else []
            if self.thread_id_type != "system":
                notes.append(f"thread ids are CUPTI '{self.thread_id_type}' ids, not gettid()")
            self._records = Records(
                gpu=gpu,
                api=api,
                markers=pair_markers(marks, close_at=t1),
                window=(t0, t1),
                thread_names=dict(self.thread_names),
                notes=notes,
            )
        return self._records

    def gpu_activity(self, device: int | None = None) -> float:
        """Union of GPU intervals over the window's wall time (see :func:`figures.gpu_activity`)."""
        t0, t1 = self.window
        return fig.gpu_activity(self.records.gpu, t0, t1, device)

    def sync_share(self) -> float:
        """Share of CUDA API time inside ``*Synchronize`` calls."""
        t0, t1 = self.window
        return fig.api_figures(self.records.api, t0, t1).sync_share

    def sync_calls_by_thread(self) -> dict[int, int]:
        """OS thread id (``threading.get_native_id()``) -> number of ``*Synchronize`` calls."""
        t0, t1 = self.window
        return fig.sync_calls_by_thread(self.records.api, t0, t1)

    def kernels(self) -> int:
        """Kernels that started in the window."""
        t0, t1 = self.window
        g = self.records.gpu
        return int(((g.kind == act.KERNEL) & fig.in_window(g.start, t0, t1)).sum())

    def summary(self, **kwargs: Any) -> ActivitySummary:
        """Every figure and the regime verdict (see :func:`regime.summarize`)."""
        t0, t1 = self.window
        return regime.summarize(self.records, t0, t1, **kwargs)

    def write_trace(self, path: str | Path) -> Path:
        """Write the records as a Perfetto/Chrome trace JSON (open it in ui.perfetto.dev)."""
        from inflight.profiling.trace import write_trace

        return write_trace(self.records, path)


def measure(**kwargs: Any) -> CuptiWindow:
    """Return a :class:`CuptiWindow` with these options (reads well in a with-statement)."""
    return CuptiWindow(**kwargs)


def collect(duration_s: float, **kwargs: Any) -> Records:
    """Record whatever the process does on the GPU for ``duration_s`` seconds.

    The calling thread sleeps; other threads keep working and are recorded.

    Args:
        duration_s: How long.
        **kwargs: :class:`CuptiWindow` options.

    Returns:
        The records.
    """
    with CuptiWindow(**kwargs) as w:
        time.sleep(duration_s)
    return w.records
