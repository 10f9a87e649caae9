"""Every figure of one window in an :class:`ActivitySummary`, and the regime they name.

:func:`summarize` computes the figures of :mod:`~inflight.profiling.figures` over a window
``[lo, hi)``, with the **gaps** (idle stretches between the merged GPU intervals), and
:func:`classify` names the regime (GPU-, launch-, sync- or host-bound) against
:class:`Thresholds` that the summary reports with its verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from inflight.profiling import intervals as iv
from inflight.profiling.activity import DTOH, GRAPH, HTOD, KERNEL, MEMCPY, Records, gpu_span
from inflight.profiling.figures import (
    api_figures,
    dispatch_durations,
    gpu_activity_by_device,
    in_window,
    osrt_wait_share,
)


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
