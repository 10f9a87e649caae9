"""The figures of a window ``[lo, hi)``, computed from :mod:`~inflight.profiling.activity`'s records.

Figures are always computed over an explicit window (:mod:`~inflight.profiling.regime` gathers
them in one summary):

* **GPU temporal activity** -- time covered by the *union* of kernel, memcpy, memset and
  graph-execution intervals, divided by the wall time of the window (not the sum of
  durations: overlapping work on two streams counts once).
* **Sync share** -- time spent inside ``cudaEventSynchronize``, ``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize`` (and the driver's ``cuEventSynchronize``, ``cuStreamSynchronize``,
  ``cuCtxSynchronize``) over all CUDA runtime + driver API time, summed over threads.
* **Launch share** -- the same for kernel and graph launch calls.
* **Dispatches** -- kernel launches + graph launches: GPU work grouped by correlation id (a
  graph launch's kernels share the launch's id), with the GPU time of each dispatch.
* **OS-runtime waits** -- the share of the CUDA threads' wall time blocked in OS-runtime calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from inflight.profiling import intervals as iv
from inflight.profiling.activity import GRAPH, I64, KERNEL, LAUNCH_APIS, SYNC_APIS, ApiCalls, GpuOps, Ranges


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
