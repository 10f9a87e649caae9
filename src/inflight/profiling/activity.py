"""Columnar records of GPU work and CUDA API calls: the containers every source fills.

Both sources of data in this package produce the same containers, so every figure is
computed by one piece of code (:mod:`~inflight.profiling.figures`, summarised and named in
:mod:`~inflight.profiling.regime`):

* :mod:`~inflight.profiling.nsys_db` loads them from an Nsight Systems sqlite export;
* :mod:`~inflight.profiling.cupti_live` fills them from cupti-python activity records.

Timestamps are integer nanoseconds on the source's own clock (nsys: session time; CUPTI:
``cuptiGetTimestamp``). The kinds of GPU work, the API domains and the names of the calls that
synchronise, launch or copy are defined here too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

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
