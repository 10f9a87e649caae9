"""In-process GPU activity measurement with cupti-python's Activity API.

Three entry points share one process-wide CUPTI owner (:func:`~inflight.profiling.cupti_hub.hub`):

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
:class:`~inflight.tool_errors.CuptiUnavailableError` says why. NVTX ranges reach CUPTI (MARKER
records) only when ``NVTX_INJECTION64_PATH`` names libcupti before the process makes its first
NVTX call; see :func:`cupti_library_path`. Seen on the H200 (CUPTI 13): ``torch.cuda.nvtx``
ranges and marks arrive (with the caller's native thread id); ranges of the ``nvtx`` package's
``annotate()`` did not, although nsys records them.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inflight.profiling import activity as act
from inflight.profiling import figures as fig
from inflight.profiling import intervals as iv
from inflight.profiling import regime
from inflight.profiling.activity import ApiCalls, GpuOps, Records
from inflight.profiling.cupti_hub import cupti_library_path, hub, import_cupti
from inflight.profiling.cupti_records import (
    K_CONCURRENT_KERNEL,
    K_DRIVER,
    K_GRAPH_TRACE,
    K_MARKER,
    K_MEMCPY,
    K_MEMSET,
    K_RUNTIME,
    Batch,
    pair_markers,
)
from inflight.profiling.regime import ActivitySummary

LOGGER = logging.getLogger(__name__)


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
