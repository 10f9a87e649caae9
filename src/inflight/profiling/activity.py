"""Columnar records of GPU work and CUDA API calls, and the figures computed from them.

Both sources of data in this package produce the same containers, so every figure is
computed by one piece of code:

* :mod:`~inflight.profiling.nsys_db` loads them from an Nsight Systems sqlite export;
* :mod:`~inflight.profiling.cupti_live` fills them from cupti-python activity records.

Timestamps are integer nanoseconds on the source's own clock (nsys: session time; CUPTI:
``cuptiGetTimestamp``). Figures are always computed over an explicit window ``[lo, hi)``.

The figures (see :class:`ActivitySummary`):

* **GPU temporal activity** -- time covered by the *union* of kernel, memcpy, memset and
  graph-execution intervals, divided by the wall time of the window (not the sum of
  durations: overlapping work on two streams counts once).
* **Sync share** -- time spent inside ``cudaEventSynchronize``, ``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize`` (and the driver's ``cuEventSynchronize``, ``cuStreamSynchronize``,
  ``cuCtxSynchronize``) over all CUDA runtime + driver API time, summed over threads.
* **Launch share** -- the same for kernel and graph launch calls.
* **Dispatches** -- kernel launches + graph launches: GPU work grouped by correlation id (a
  graph launch's kernels share the launch's id), with the GPU time of each dispatch.
* **Gaps** -- idle stretches between the merged GPU intervals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from inflight.profiling import intervals as iv

I64 = npt.NDArray[np.int64]

# -- kinds of GPU work ------------------------------------------------------------------------
KERNEL = 0
MEMCPY = 1
MEMSET = 2
GRAPH = 3  # a whole CUDA graph execution (nsys --cuda-graph-trace=graph / CUPTI GRAPH_TRACE)
GPU_KIND_NAMES = {KERNEL: "kernel", MEMCPY: "memcpy", MEMSET: "memset", GRAPH: "graph"}

# -- API domains ------------------------------------------------------------------------------
RUNTIME = 0
DRIVER = 1

#: CUPTI's memcpy kinds (``CUpti_ActivityMemcpyKind``, cupti_activity.h; the same numbers in
#: cupti-python's ``ActivityMemcpyKind``). Used as the canonical copy-kind code everywhere.
COPY_KINDS = {
    0: "unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
}
HTOD = 1
DTOH = 2

#: Blocking synchronisation calls (base names, see :func:`api_base_name`).
SYNC_APIS = frozenset(
    {
        "cudaEventSynchronize",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaThreadSynchronize",  # deprecated alias of cudaDeviceSynchronize
        "cudaExecutionCtxSynchronize",  # CUDA 13.1 execution contexts
        "cuEventSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
    }
)
#: Calls that put one kernel or one graph on a stream.
LAUNCH_APIS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cudaGraphLaunch",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernelMultiDevice",
        "cuLaunchGrid",
        "cuLaunchGridAsync",
        "cuGraphLaunch",
    }
)

#: Prefixes of copy calls: a copy to or from pageable host memory blocks the caller like a sync.
COPY_API_PREFIXES = ("cudaMemcpy", "cuMemcpy")

_SUFFIX = re.compile(r"(_v\d+|_ptsz|_ptds)$")


def api_base_name(name: str) -> str:
    """Strip the version and per-thread-stream suffixes from a CUDA API name.

    nsys (``StringIds``) and CUPTI (``RuntimeApiTraceCbid``) name runtime calls with the version
    that introduced them, e.g. ``cudaStreamSynchronize_v3020``,
    ``cudaStreamSynchronize_ptsz_v7000`` or ``cudaLaunchHostFunc_v2_v13020``; driver calls
    may carry ``_v2``/``_ptsz``. All of these reduce to the plain function name.

    Args:
        name: The name as recorded.

    Returns:
        The base name, e.g. ``cudaStreamSynchronize``.
    """
    name = name.strip()
    while True:
        stripped = _SUFFIX.sub("", name)
        if stripped == name:
            return name
        name = stripped


def _i64(values: Any) -> I64:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _obj(values: Any, n: int) -> npt.NDArray[np.object_]:
    out = np.empty(n, dtype=object)
    if values is not None:
        out[:] = list(values) if not isinstance(values, np.ndarray) else values
    else:
        out[:] = ""
    return out


@dataclass
class GpuOps:
    """Columnar GPU work: one row per kernel, copy, memset or graph execution.

    Attributes:
        kind: ``KERNEL``, ``MEMCPY``, ``MEMSET`` or ``GRAPH``.
        start: Start, ns.
        end: End, ns.
        device: Device id.
        stream: Stream id.
        correlation: Correlation id of the API call that launched it (0 if unknown).
        process: Process id (correlation ids are per process).
        bytes: Bytes moved (copies, memsets); 0 otherwise.
        copy_kind: CUPTI memcpy kind (:data:`COPY_KINDS`); 0 otherwise.
        name: Kernel name (object array of ``str``; ``""`` when unknown or not a kernel).
    """

    kind: npt.NDArray[np.int8]
    start: I64
    end: I64
    device: I64
    stream: I64
    correlation: I64
    process: I64
    bytes: I64
    copy_kind: I64
    name: npt.NDArray[np.object_]

    @classmethod
    def from_columns(
        cls,
        *,
        kind: Any,
        start: Any,
        end: Any,
        device: Any = None,
        stream: Any = None,
        correlation: Any = None,
        process: Any = None,
        bytes: Any = None,  # the field name CUPTI and nsys use
        copy_kind: Any = None,
        name: Any = None,
    ) -> GpuOps:
        """Build from sequences; missing columns become zeros (names: empty strings).

        Returns:
            The container.
        """
        s = _i64(start)
        n = s.size
        k = np.asarray(kind, dtype=np.int8).reshape(-1)
        if k.size == 1 and n != 1:
            k = np.full(n, k[0], dtype=np.int8)

        def col(v: Any) -> I64:
            return np.zeros(n, dtype=np.int64) if v is None else _i64(v)

        return cls(
            kind=k,
            start=s,
            end=_i64(end),
            device=col(device),
            stream=col(stream),
            correlation=col(correlation),
            process=col(process),
            bytes=col(bytes),
            copy_kind=col(copy_kind),
            name=_obj(name, n),
        )

    @classmethod
    def empty(cls) -> GpuOps:
        """An empty container."""
        return cls.from_columns(kind=[], start=[], end=[])

    def __len__(self) -> int:
        return int(self.start.size)

    def select(self, mask: npt.NDArray[np.bool_] | I64) -> GpuOps:
        """Rows where ``mask`` is True (or at the given indices)."""
        return GpuOps(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def concat(parts: Sequence[GpuOps]) -> GpuOps:
        """Concatenate containers."""
        if not parts:
            return GpuOps.empty()
        return GpuOps(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(GpuOps)})


@dataclass
class ApiCalls:
    """Columnar CUDA runtime/driver API calls (CPU side).

    Attributes:
        domain: ``RUNTIME`` or ``DRIVER``.
        start: Entry, ns.
        end: Return, ns.
        process: OS process id.
        thread: OS thread id (see :mod:`~inflight.profiling.cupti_live` for how CUPTI's relates
            to ``threading.get_native_id()``).
        correlation: Correlation id (matches the GPU work the call launched).
        name: Base API name (:func:`api_base_name`), object array of ``str``.
    """

    domain: npt.NDArray[np.int8]
    start: I64
    end: I64
    process: I64
    thread: I64
    correlation: I64
    name: npt.NDArray[np.object_]

    @classmethod
    def from_columns(
        cls,
        *,
        start: Any,
        end: Any,
        name: Any,
        domain: Any = RUNTIME,
        process: Any = None,
        thread: Any = None,
        correlation: Any = None,
    ) -> ApiCalls:
        """Build from sequences; names are reduced with :func:`api_base_name`.

        Returns:
            The container.
        """
        s = _i64(start)
        n = s.size
        d = np.asarray(domain, dtype=np.int8).reshape(-1)
        if d.size == 1 and n != 1:
            d = np.full(n, d[0], dtype=np.int8)

        def col(v: Any) -> I64:
            return np.zeros(n, dtype=np.int64) if v is None else _i64(v)

        cache: dict[str, str] = {}
        names = _obj(None, n)
        for i, raw in enumerate(name):
            text = str(raw)
            base = cache.get(text)
            if base is None:
                base = cache[text] = api_base_name(text)
            names[i] = base
        return cls(
            domain=d,
            start=s,
            end=_i64(end),
            process=col(process),
            thread=col(thread),
            correlation=col(correlation),
            name=names,
        )

    @classmethod
    def empty(cls) -> ApiCalls:
        """An empty container."""
        return cls.from_columns(start=[], end=[], name=[])

    def __len__(self) -> int:
        return int(self.start.size)

    def select(self, mask: npt.NDArray[np.bool_] | I64) -> ApiCalls:
        """Rows where ``mask`` is True (or at the given indices)."""
        return ApiCalls(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def concat(parts: Sequence[ApiCalls]) -> ApiCalls:
        """Concatenate containers."""
        if not parts:
            return ApiCalls.empty()
        return ApiCalls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(ApiCalls)})

    def is_in(self, names: Iterable[str]) -> npt.NDArray[np.bool_]:
        """Mask of calls whose base name is in ``names``."""
        wanted = sorted(set(names))
        if not len(self) or not wanted:
            return np.zeros(len(self), dtype=bool)
        return np.isin(self.name.astype(str), wanted)

    def is_copy(self) -> npt.NDArray[np.bool_]:
        """Mask of memcpy calls (``cudaMemcpy*``, ``cuMemcpy*``)."""
        if not len(self):
            return np.zeros(0, dtype=bool)
        return np.char.startswith(self.name.astype(str), COPY_API_PREFIXES[0]) | np.char.startswith(
            self.name.astype(str), COPY_API_PREFIXES[1]
        )

    def outermost(self) -> npt.NDArray[np.bool_]:
        """Mask dropping driver calls nested inside a runtime call of the same thread.

        The runtime implements its calls with driver calls. CUPTI and nsys report the driver
        calls an application makes itself; should a source also report the runtime's inner
        ones, counting both would count the same wall time twice. A driver call that lies
        entirely inside a runtime call on the same (process, thread) is such an inner call.

        Returns:
            True for calls to keep.
        """
        keep = np.ones(len(self), dtype=bool)
        drv = self.domain == DRIVER
        if not drv.any() or drv.all():
            return keep
        rt = ~drv
        for proc, thread in {(int(p), int(t)) for p, t in zip(self.process[drv], self.thread[drv], strict=True)}:
            r = rt & (self.process == proc) & (self.thread == thread)
            if not r.any():
                continue
            order = np.argsort(self.start[r], kind="stable")
            rs, re_ = self.start[r][order], np.maximum.accumulate(self.end[r][order])
            d = np.flatnonzero(drv & (self.process == proc) & (self.thread == thread))
            idx = np.searchsorted(rs, self.start[d], side="right") - 1
            inside = (idx >= 0) & (re_[np.maximum(idx, 0)] >= self.end[d])
            keep[d[inside]] = False
        return keep


@dataclass
class Ranges:
    """Named CPU-side ranges (NVTX push/pop or start/end ranges, OS-runtime calls).

    Attributes:
        start: Start, ns.
        end: End, ns (equal to ``start`` for instantaneous marks).
        process: OS process id.
        thread: OS thread id.
        name: Range text, object array of ``str``.
    """

    start: I64
    end: I64
    process: I64
    thread: I64
    name: npt.NDArray[np.object_]

    @classmethod
    def from_columns(cls, *, start: Any, end: Any, name: Any, process: Any = None, thread: Any = None) -> Ranges:
        """Build from sequences.

        Returns:
            The container.
        """
        s = _i64(start)
        n = s.size

        def col(v: Any) -> I64:
            return np.zeros(n, dtype=np.int64) if v is None else _i64(v)

        return cls(start=s, end=_i64(end), process=col(process), thread=col(thread), name=_obj(name, n))

    @classmethod
    def empty(cls) -> Ranges:
        """An empty container."""
        return cls.from_columns(start=[], end=[], name=[])

    def __len__(self) -> int:
        return int(self.start.size)

    def select(self, mask: npt.NDArray[np.bool_] | I64) -> Ranges:
        """Rows where ``mask`` is True (or at the given indices)."""
        return Ranges(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def concat(parts: Sequence[Ranges]) -> Ranges:
        """Concatenate containers."""
        if not parts:
            return Ranges.empty()
        return Ranges(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Ranges)})


@dataclass
class Records:
    """Everything one collection produced.

    Attributes:
        gpu: GPU work.
        api: CUDA API calls.
        markers: NVTX ranges (empty when not collected).
        osrt: OS-runtime calls (nsys ``OSRT_API``; empty from CUPTI).
        window: ``(lo, hi)`` of the collection when known (CUPTI windows), else None.
        thread_names: OS thread id -> name, when known.
        notes: Free-form remarks about the collection (dropped records, missing kinds).
    """

    gpu: GpuOps = field(default_factory=GpuOps.empty)
    api: ApiCalls = field(default_factory=ApiCalls.empty)
    markers: Ranges = field(default_factory=Ranges.empty)
    osrt: Ranges = field(default_factory=Ranges.empty)
    window: tuple[int, int] | None = None
    thread_names: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def span(self) -> tuple[int, int] | None:
        """First start to last end of the GPU work, or None when there is none."""
        return gpu_span(self.gpu)


# -- figures ------------------------------------------------------------------------------------


def gpu_span(gpu: GpuOps) -> tuple[int, int] | None:
    """First start to last end of the GPU work (the default measurement window).

    Args:
        gpu: GPU work.

    Returns:
        ``(lo, hi)`` or None when there is no GPU work.
    """
    if len(gpu) == 0:
        return None
    return int(gpu.start.min()), int(gpu.end.max())


def in_window(start: I64, lo: int, hi: int) -> npt.NDArray[np.bool_]:
    """Mask of records that start inside ``[lo, hi)`` (used for counts and durations)."""
    return (start >= lo) & (start < hi)


def gpu_activity_by_device(gpu: GpuOps, lo: int, hi: int) -> dict[int, float]:
    """GPU temporal activity of each device over ``[lo, hi)``.

    Args:
        gpu: GPU work.
        lo: Window start, ns.
        hi: Window end, ns.

    Returns:
        ``{device: busy fraction}`` for every device with work in the records.
    """
    out: dict[int, float] = {}
    for dev in np.unique(gpu.device):
        m = gpu.device == dev
        out[int(dev)] = iv.busy_fraction(gpu.start[m], gpu.end[m], lo, hi)
    return out


def gpu_activity(gpu: GpuOps, lo: int, hi: int, device: int | None = None) -> float:
    """GPU temporal activity: union of the GPU intervals over the window's wall time.

    With several devices and no ``device`` given, the mean over the devices (each device's
    union is taken separately: two GPUs busy at once are not "200 % busy").

    Args:
        gpu: GPU work.
        lo: Window start, ns.
        hi: Window end, ns.
        device: Only this device.

    Returns:
        A fraction in ``[0, 1]``.
    """
    if device is not None:
        m = gpu.device == device
        return iv.busy_fraction(gpu.start[m], gpu.end[m], lo, hi)
    per = gpu_activity_by_device(gpu, lo, hi)
    return float(np.mean(list(per.values()))) if per else 0.0


def clipped_durations(start: I64, end: I64, lo: int, hi: int) -> I64:
    """Per-record time inside ``[lo, hi)`` (0 for records outside), same order as the input."""
    return np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0, None).astype(np.int64)


@dataclass(frozen=True)
class ApiFigures:
    """CUDA API time over a window (clipped to it, summed over threads).

    Attributes:
        calls: Calls that started in the window.
        total_ns: API time inside the window.
        sync_ns: Part of it in synchronisation calls.
        launch_ns: Part of it in kernel/graph launch calls.
        copy_ns: Part of it in memcpy calls.
        sync_calls: Synchronisation calls that started in the window.
        launch_calls: Launch calls that started in the window.
        issue_total_ns: API time of the threads that launch work (the issue path).
        issue_sync_ns: Part of it in synchronisation calls: a wait that holds up the next launch.
    """

    calls: int
    total_ns: int
    sync_ns: int
    launch_ns: int
    copy_ns: int
    sync_calls: int
    launch_calls: int
    issue_total_ns: int = 0
    issue_sync_ns: int = 0

    @property
    def issue_sync_share(self) -> float | None:
        """``issue_sync_ns / issue_total_ns``; None when no thread launched anything."""
        return self.issue_sync_ns / self.issue_total_ns if self.issue_total_ns else None

    @property
    def sync_share(self) -> float:
        """``sync_ns / total_ns`` (0.0 without API time)."""
        return self.sync_ns / self.total_ns if self.total_ns else 0.0

    @property
    def launch_share(self) -> float:
        """``launch_ns / total_ns`` (0.0 without API time)."""
        return self.launch_ns / self.total_ns if self.total_ns else 0.0

    @property
    def copy_share(self) -> float:
        """``copy_ns / total_ns`` (0.0 without API time)."""
        return self.copy_ns / self.total_ns if self.total_ns else 0.0


def api_figures(api: ApiCalls, lo: int, hi: int) -> ApiFigures:
    """Sync and launch shares of the CUDA API time in ``[lo, hi)``.

    Args:
        api: API calls.
        lo: Window start, ns.
        hi: Window end, ns.

    Returns:
        The figures.
    """
    api = api.select(api.outermost())
    dur = clipped_durations(api.start, api.end, lo, hi)
    started = in_window(api.start, lo, hi)
    sync = api.is_in(SYNC_APIS)
    launch = api.is_in(LAUNCH_APIS)
    # the issue path: every (process, thread) that launched something in the window
    key = api.process.astype(np.int64) * (1 << 32) + api.thread.astype(np.int64)
    issuing = np.isin(key, np.unique(key[started & launch]))
    return ApiFigures(
        calls=int(started.sum()),
        total_ns=int(dur.sum()),
        sync_ns=int(dur[sync].sum()),
        launch_ns=int(dur[launch].sum()),
        copy_ns=int(dur[api.is_copy()].sum()),
        sync_calls=int((started & sync).sum()),
        launch_calls=int((started & launch).sum()),
        issue_total_ns=int(dur[issuing].sum()),
        issue_sync_ns=int(dur[issuing & sync].sum()),
    )


def sync_calls_by_thread(api: ApiCalls, lo: int | None = None, hi: int | None = None) -> dict[int, int]:
    """Count synchronisation calls per OS thread id.

    Args:
        api: API calls.
        lo: Only calls starting at or after this time.
        hi: Only calls starting before this time.

    Returns:
        ``{thread id: number of *Synchronize calls}``; threads without any are absent.
    """
    m = api.is_in(SYNC_APIS)
    if lo is not None:
        m &= api.start >= lo
    if hi is not None:
        m &= api.start < hi
    threads, counts = np.unique(api.thread[m], return_counts=True)
    return {int(t): int(c) for t, c in zip(threads, counts, strict=True)}


def dispatch_durations(gpu: GpuOps, lo: int, hi: int) -> I64:
    """GPU time of each dispatch (kernel launch or graph launch) that started in the window.

    Kernels and graph executions are grouped by (process, correlation id): all kernels of a
    graph launched with ``cudaGraphLaunch`` share the launch's correlation id (node-level
    trace), and a graph-level trace has one ``GRAPH`` row per launch. A dispatch lasts from its
    first start to its last end. Rows without a correlation id (0) each count as one dispatch.

    Args:
        gpu: GPU work.
        lo: Window start, ns.
        hi: Window end, ns.

    Returns:
        Durations in ns, one per dispatch, in no particular order.
    """
    m = ((gpu.kind == KERNEL) | (gpu.kind == GRAPH)) & in_window(gpu.start, lo, hi)
    if not m.any():
        return np.zeros(0, dtype=np.int64)
    start, end, corr, proc = gpu.start[m], gpu.end[m], gpu.correlation[m], gpu.process[m]
    has = corr != 0
    out = [end[~has] - start[~has]]
    if has.any():
        keys = np.stack([proc[has], corr[has]], axis=1)
        _, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        n = int(inverse.max()) + 1
        first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(first, inverse, start[has])
        np.maximum.at(last, inverse, end[has])
        out.append(last - first)
    return np.concatenate(out).astype(np.int64)


def _us(ns: float | None) -> float | None:
    return None if ns is None else float(ns) / 1e3


def _median(a: npt.NDArray[Any]) -> float | None:
    return float(np.median(a)) if a.size else None


def _quantile(a: npt.NDArray[Any], q: float) -> float | None:
    return float(np.quantile(a, q)) if a.size else None


@dataclass(frozen=True)
class Thresholds:
    """Where the regime verdict draws its lines (all configurable, all reported).

    Attributes:
        busy: GPU activity at or above this means "no idle gaps to speak of".
        sync_high: Sync share at or above this is "high".
        launch_high: Launch share at or above this is "high".
        short_dispatch_us: A median dispatch below this is "short".
    """

    busy: float = 0.90
    sync_high: float = 0.50
    launch_high: float = 0.30
    short_dispatch_us: float = 100.0


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Verdict:
    """The regime and the figures behind it.

    Attributes:
        regime: ``GPU-bound``, ``sync-bound``, ``launch-bound``, ``host-bound`` or ``no GPU work``.
        reason: One sentence with the figures and the thresholds they were compared to.
    """

    regime: str
    reason: str


@dataclass(frozen=True)
class ActivitySummary:
    """Figures of one window (all times in the units their names say).

    Attributes:
        window_start_ns: Window start on the source clock.
        window_end_ns: Window end.
        wall_s: Window length.
        devices: Devices with GPU work.
        gpu_activity: Union of GPU intervals / wall (mean over devices).
        gpu_activity_by_device: Per device.
        kernels: Kernels that started in the window.
        kernel_median_us: Median kernel duration.
        graph_executions: Graph-level executions (graph trace) that started in the window.
        dispatches: Kernel launches + graph launches (see :func:`dispatch_durations`).
        dispatches_per_s: Dispatch rate.
        dispatch_median_us: Median GPU time per dispatch.
        memcpys: Copies that started in the window.
        h2d_copies: Host-to-device copies.
        h2d_avg_bytes: Average bytes per host-to-device copy.
        d2h_copies: Device-to-host copies.
        d2h_avg_bytes: Average bytes per device-to-host copy.
        api_calls: CUDA API calls that started in the window.
        api_time_s: CUDA API time in the window (summed over threads).
        sync_share: Share of the API time in synchronisation calls.
        issue_sync_share: The same, over the threads that launch work only (None when none did).
        sync_calls: Synchronisation calls.
        launch_share: Share of the API time in launch calls.
        launch_calls: Launch calls.
        copy_share: Share of the API time in memcpy calls (blocking when host memory is pageable).
        gap_count: Idle gaps between merged GPU intervals (first device when several).
        gap_median_us: Median gap.
        gap_p90_us: 90th percentile gap.
        gap_max_us: Longest gap.
        osrt_wait_share: Share of the CUDA threads' wall time blocked in OS-runtime waits (None
            without OSRT data; see :func:`osrt_wait_share`).
        verdict: The regime.
        thresholds: The thresholds the verdict used.
    """

    window_start_ns: int
    window_end_ns: int
    wall_s: float
    devices: list[int]
    gpu_activity: float
    gpu_activity_by_device: dict[int, float]
    kernels: int
    kernel_median_us: float | None
    graph_executions: int
    dispatches: int
    dispatches_per_s: float
    dispatch_median_us: float | None
    memcpys: int
    h2d_copies: int
    h2d_avg_bytes: float | None
    d2h_copies: int
    d2h_avg_bytes: float | None
    api_calls: int
    api_time_s: float
    sync_share: float
    issue_sync_share: float | None
    sync_calls: int
    launch_share: float
    launch_calls: int
    copy_share: float
    gap_count: int
    gap_median_us: float | None
    gap_p90_us: float | None
    gap_max_us: float | None
    osrt_wait_share: float | None
    verdict: Verdict
    thresholds: Thresholds

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = asdict(self)
        d["gpu_activity_by_device"] = {str(k): v for k, v in self.gpu_activity_by_device.items()}
        return d


#: OS-runtime calls that block the thread (waiting for another thread, a timer or I/O).
OSRT_WAITS = frozenset(
    {
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "pthread_cond_clockwait",
        "pthread_mutex_lock",
        "pthread_mutex_timedlock",
        "pthread_rwlock_rdlock",
        "pthread_rwlock_wrlock",
        "pthread_rwlock_timedrdlock",
        "pthread_rwlock_timedwrlock",
        "pthread_join",
        "pthread_barrier_wait",
        "sem_wait",
        "sem_timedwait",
        "sem_clockwait",
        "poll",
        "ppoll",
        "select",
        "pselect",
        "pselect6",
        "epoll_wait",
        "epoll_pwait",
        "epoll_pwait2",
        "nanosleep",
        "clock_nanosleep",
        "usleep",
        "sleep",
        "sched_yield",
        "futex",
        "wait",
        "waitpid",
        "waitid",
        "msgrcv",
        "accept",
        "accept4",
        "recv",
        "recvfrom",
        "recvmsg",
        "read",
    }
)


def osrt_wait_share(osrt: Ranges, lo: int, hi: int, threads: ApiCalls | None = None) -> float | None:
    """Share of the CUDA threads' wall time spent blocked in OS-runtime waits.

    nsys traces only OS-runtime calls longer than its threshold, so nearly every traced call is
    a wait; the useful question is how much of the time of the threads that drive the GPU goes
    to them. The threads are those with CUDA API calls in the window (``threads``); without
    any, every thread with OS-runtime calls counts.

    Args:
        osrt: OS-runtime calls (nsys ``OSRT_API``).
        lo: Window start, ns.
        hi: Window end, ns.
        threads: API calls whose (process, thread) pairs select the threads.

    Returns:
        ``wait time / (window * threads)``, or None without OS-runtime data in the window.
    """
    if len(osrt) == 0 or hi <= lo:
        return None
    dur = clipped_durations(osrt.start, osrt.end, lo, hi)
    if int(dur.sum()) == 0:
        return None
    waits = np.isin(osrt.name.astype(str), sorted(OSRT_WAITS))
    keys = osrt.process * (1 << 32) + osrt.thread
    if threads is not None and len(threads):
        m = in_window(threads.start, lo, hi) | (threads.end > lo) & (threads.start < hi)
        wanted = np.unique(threads.process[m] * (1 << 32) + threads.thread[m])
    else:
        wanted = np.unique(keys)
    if wanted.size == 0:
        return None
    sel = waits & np.isin(keys, wanted)
    return min(int(dur[sel].sum()) / ((hi - lo) * wanted.size), 1.0)


def classify(
    *,
    gpu_activity: float,
    sync_share: float,
    launch_share: float,
    dispatch_median_us: float | None,
    copy_share: float = 0.0,
    gap_count: int,
    gap_median_us: float | None,
    dispatches: int,
    issue_sync_share: float | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> Verdict:
    """Name the regime from the figures.

    * **GPU-bound**: the GPU is busy (activity >= ``busy``); if the host's CUDA time is mostly
      synchronisation, it is waiting for long GPU work.
    * **launch-bound**: the GPU idles and the host's CUDA time goes to launch calls.
    * **sync-bound**: the GPU idles between short dispatches while the host's CUDA time goes to
      synchronisation: launch, wait, launch -- each round trip leaves a gap.
    * **host-bound**: the GPU idles but the host is neither launching nor synchronising much;
      the time goes to host work outside CUDA (request handling, Python, copies to staging).
      Also when the synchronisation happens on threads that launch nothing
      (``issue_sync_share`` low): a completion thread waiting does not hold up the next launch.

    Returns:
        The verdict with a sentence citing each figure against its threshold.
    """
    t = thresholds
    if dispatches == 0 and gpu_activity == 0.0:
        return Verdict("no GPU work", "no kernel, copy or graph execution in the window")
    act = f"GPU activity {gpu_activity:.0%}"
    syn = f"sync share {sync_share:.0%}"
    lau = f"launch share {launch_share:.0%}"
    med = "n/a" if dispatch_median_us is None else f"{dispatch_median_us:.0f} µs"
    gap = f"{gap_count} idle gaps" + ("" if gap_median_us is None else f" (median {gap_median_us:.1f} µs)")
    if gpu_activity >= t.busy:
        why = f"{act} (>= {t.busy:.0%}), {gap}, median dispatch {med}"
        if sync_share >= t.sync_high:
            why += f"; {syn} (>= {t.sync_high:.0%}): the host waits for the GPU"
        else:
            why += f"; {syn}"
        return Verdict("GPU-bound", why)
    if launch_share >= t.launch_high:
        return Verdict(
            "launch-bound",
            f"{act} (< {t.busy:.0%}) with {gap}; {lau} (>= {t.launch_high:.0%}) of CUDA API time; "
            f"{syn}; median dispatch {med}",
        )
    off_path = issue_sync_share is not None and issue_sync_share < t.sync_high
    if sync_share >= t.sync_high and off_path:
        return Verdict(
            "host-bound",
            f"{act} (< {t.busy:.0%}), {gap}; {syn} overall, but only {issue_sync_share:.0%} "
            f"(< {t.sync_high:.0%}) on the threads that launch: the waits are off the issue path, "
            "so the idle time comes from host work outside CUDA (request handling, responses, Python)",
        )
    if sync_share >= t.sync_high:
        short = dispatch_median_us is not None and dispatch_median_us < t.short_dispatch_us
        size = f"short dispatches (median {med} < {t.short_dispatch_us:.0f} µs)" if short else f"median dispatch {med}"
        return Verdict(
            "sync-bound",
            f"{syn} (>= {t.sync_high:.0%}) with {size}; {act} (< {t.busy:.0%}), {gap}: "
            "each launch-wait round trip leaves the GPU idle",
        )
    copies = ""
    if copy_share >= t.sync_high:
        copies = (
            f"; but {copy_share:.0%} of CUDA API time is in memcpy calls, which block like a sync on pageable memory"
        )
    return Verdict(
        "host-bound",
        f"{act} (< {t.busy:.0%}), {gap}; {syn} (< {t.sync_high:.0%}) and {lau} (< {t.launch_high:.0%}): "
        "the host spends its time outside CUDA calls" + copies,
    )


def summarize(
    records: Records,
    lo: int | None = None,
    hi: int | None = None,
    *,
    device: int | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> ActivitySummary:
    """Compute every figure over ``[lo, hi)``.

    Without ``lo``/``hi`` the window is the collection's own (``records.window``, e.g. a
    :class:`~inflight.profiling.cupti_live.CuptiWindow`), else first to last GPU activity.

    Args:
        records: The collection.
        lo: Window start, ns.
        hi: Window end, ns.
        device: Restrict GPU figures to one device.
        thresholds: Verdict thresholds.

    Returns:
        The summary.

    Raises:
        ValueError: when no window is given and there is no GPU work to derive one from.
    """
    gpu = records.gpu if device is None else records.gpu.select(records.gpu.device == device)
    span = records.window or gpu_span(gpu)
    if lo is None or hi is None:
        if span is None:
            raise ValueError("no GPU work and no collection window in the records; pass lo/hi explicitly")
        lo = span[0] if lo is None else lo
        hi = span[1] if hi is None else hi
    if hi < lo:
        raise ValueError(f"window ends before it starts ({lo} > {hi})")
    wall_ns = max(hi - lo, 0)
    wall_s = wall_ns / 1e9

    per_dev = gpu_activity_by_device(gpu, lo, hi)
    activity = float(np.mean(list(per_dev.values()))) if per_dev else 0.0
    started = in_window(gpu.start, lo, hi)
    kern = started & (gpu.kind == KERNEL)
    kdur = (gpu.end - gpu.start)[kern]
    graphs = int((started & (gpu.kind == GRAPH)).sum())
    ddur = dispatch_durations(gpu, lo, hi)
    copies = started & (gpu.kind == MEMCPY)
    h2d = copies & (gpu.copy_kind == HTOD)
    d2h = copies & (gpu.copy_kind == DTOH)

    # Gaps of the first device (or the one asked for): a multi-GPU union would hide them.
    devices = sorted(per_dev)
    if devices:
        m = gpu.device == devices[0]
        gs, ge = iv.gaps(gpu.start[m], gpu.end[m], lo, hi)
        glen = (ge - gs).astype(np.int64)
    else:
        glen = np.zeros(0, dtype=np.int64)

    api = api_figures(records.api, lo, hi)
    gap_median = _us(_median(glen))
    dmed = _us(_median(ddur))
    verdict = classify(
        gpu_activity=activity,
        sync_share=api.sync_share,
        launch_share=api.launch_share,
        dispatch_median_us=dmed,
        copy_share=api.copy_share,
        gap_count=int(glen.size),
        gap_median_us=gap_median,
        dispatches=int(ddur.size),
        issue_sync_share=api.issue_sync_share,
        thresholds=thresholds,
    )
    return ActivitySummary(
        window_start_ns=int(lo),
        window_end_ns=int(hi),
        wall_s=wall_s,
        devices=devices,
        gpu_activity=activity,
        gpu_activity_by_device=per_dev,
        kernels=int(kern.sum()),
        kernel_median_us=_us(_median(kdur)),
        graph_executions=graphs,
        dispatches=int(ddur.size),
        dispatches_per_s=ddur.size / wall_s if wall_s > 0 else 0.0,
        dispatch_median_us=dmed,
        memcpys=int(copies.sum()),
        h2d_copies=int(h2d.sum()),
        h2d_avg_bytes=float(gpu.bytes[h2d].mean()) if h2d.any() else None,
        d2h_copies=int(d2h.sum()),
        d2h_avg_bytes=float(gpu.bytes[d2h].mean()) if d2h.any() else None,
        api_calls=api.calls,
        api_time_s=api.total_ns / 1e9,
        sync_share=api.sync_share,
        issue_sync_share=api.issue_sync_share,
        sync_calls=api.sync_calls,
        launch_share=api.launch_share,
        launch_calls=api.launch_calls,
        copy_share=api.copy_share,
        gap_count=int(glen.size),
        gap_median_us=gap_median,
        gap_p90_us=_us(_quantile(glen, 0.9)),
        gap_max_us=_us(float(glen.max()) if glen.size else None),
        osrt_wait_share=osrt_wait_share(records.osrt, lo, hi, records.api),
        verdict=verdict,
        thresholds=thresholds,
    )
