"""A timeline PNG of a few milliseconds, laid out like an Nsight Systems screenshot.

One row per (GPU, stream) with kernels, copies (by direction), memsets and graph executions;
below them one row per CPU thread that made CUDA calls, with its synchronisation calls and
launch calls. matplotlib is imported lazily (``pip install matplotlib``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from inflight.profiling import activity as act
from inflight.profiling.activity import Records
from inflight.profiling.figures import clipped_durations

LOGGER = logging.getLogger(__name__)

#: Colours per category (also the legend).
COLORS = {
    "kernel": "#4878d0",
    "graph": "#8060c0",
    "HtoD": "#3a9d3a",
    "DtoH": "#d04040",
    "other copy": "#e08020",
    "memset": "#909090",
    "sync call": "#e0b000",
    "launch call": "#40b0c0",
    "memcpy call": "#a0522d",
    "other CUDA call": "#c8c8c8",
}


def slice_at(lo: int, hi: int, ms: float, at: int | None = None) -> tuple[int, int]:
    """Pick a ``ms``-long slice inside ``[lo, hi)``: at ``at`` or centred in the window.

    Args:
        lo: Window start, ns.
        hi: Window end, ns.
        ms: Slice length, ms.
        at: Slice start, ns (clamped into the window).

    Returns:
        ``(t0, t1)`` in ns.
    """
    length = int(ms * 1e6)
    if length >= hi - lo:
        return lo, hi
    t0 = lo + (hi - lo - length) // 2 if at is None else min(max(int(at), lo), hi - length)
    return t0, t0 + length


def _gpu_category(kind: int, copy_kind: int) -> str:
    if kind == act.KERNEL:
        return "kernel"
    if kind == act.GRAPH:
        return "graph"
    if kind == act.MEMSET:
        return "memset"
    if copy_kind == act.HTOD:
        return "HtoD"
    if copy_kind == act.DTOH:
        return "DtoH"
    return "other copy"


def timeline_rows(
    records: Records, t0: int, t1: int, *, max_threads: int = 6
) -> list[tuple[str, dict[str, list[tuple[float, float]]]]]:
    """The bars to draw: ``[(row label, {category: [(start_ms, width_ms), ...]})]``.

    Times are relative to ``t0`` in ms; bars are clipped to the slice. CPU threads are ordered
    by CUDA API time in the slice and limited to ``max_threads``.

    Args:
        records: The collection.
        t0: Slice start, ns.
        t1: Slice end, ns.
        max_threads: At most this many CPU-thread rows.

    Returns:
        The rows, GPU streams first.
    """
    rows: list[tuple[str, dict[str, list[tuple[float, float]]]]] = []
    g = records.gpu
    m = (g.end > t0) & (g.start < t1)
    keys = sorted({(int(d), int(s)) for d, s in zip(g.device[m], g.stream[m], strict=True)})
    for dev, stream in keys:
        sel = m & (g.device == dev) & (g.stream == stream)
        bars: dict[str, list[tuple[float, float]]] = {}
        for k, ck, s, e in zip(g.kind[sel], g.copy_kind[sel], g.start[sel], g.end[sel], strict=True):
            s0, e0 = max(int(s), t0), min(int(e), t1)
            bars.setdefault(_gpu_category(int(k), int(ck)), []).append(((s0 - t0) / 1e6, max(e0 - s0, 1) / 1e6))
        rows.append((f"GPU {dev} stream {stream}", bars))
    a = records.api
    m = (a.end > t0) & (a.start < t1)
    if m.any():
        sync = a.is_in(act.SYNC_APIS)
        launch = a.is_in(act.LAUNCH_APIS)
        copy = a.is_copy()
        dur = clipped_durations(a.start, a.end, t0, t1)
        threads, inverse = np.unique(a.thread[m], return_inverse=True)
        busy = np.bincount(inverse.reshape(-1), weights=dur[m].astype(np.float64))
        for tid in threads[np.argsort(-busy)][:max_threads]:
            sel = m & (a.thread == tid)
            bars = {}
            for is_s, is_l, is_c, s, e in zip(sync[sel], launch[sel], copy[sel], a.start[sel], a.end[sel], strict=True):
                cat = "sync call" if is_s else "launch call" if is_l else "memcpy call" if is_c else "other CUDA call"
                s0, e0 = max(int(s), t0), min(int(e), t1)
                bars.setdefault(cat, []).append(((s0 - t0) / 1e6, max(e0 - s0, 1) / 1e6))
            name = records.thread_names.get(int(tid))
            rows.append((f"thread {tid}" + (f" ({name})" if name else ""), bars))
    return rows


def plot_timeline(records: Records, t0: int, t1: int, path: str | Path, *, title: str = "") -> Path:
    """Draw the slice ``[t0, t1)`` of the records to a PNG.

    Args:
        records: The collection.
        t0: Slice start, ns.
        t1: Slice end, ns.
        path: Output PNG.
        title: Figure title.

    Returns:
        The path written.

    Raises:
        ImportError: when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise ImportError("matplotlib is needed for the timeline PNG: pip install matplotlib") from None

    rows = timeline_rows(records, t0, t1)
    n = max(len(rows), 1)
    fig, ax = plt.subplots(figsize=(14, 1.4 + 0.45 * n))
    used: set[str] = set()
    for i, (_, bars) in enumerate(rows):
        y = n - 1 - i
        for cat, spans in bars.items():
            ax.broken_barh(spans, (y - 0.38, 0.76), facecolors=COLORS[cat], edgecolors="none")
            used.add(cat)
    ax.set_yticks([n - 1 - i for i in range(len(rows))])
    ax.set_yticklabels([label for label, _ in rows], fontsize=8)
    ax.set_xlim(0, (t1 - t0) / 1e6)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel(f"ms after t = {t0} ns")
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    handles: list[Any] = [Patch(color=COLORS[c], label=c) for c in COLORS if c in used]
    if handles:  # above the axes, right-aligned, beside the title
        ax.legend(
            handles=handles,
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            ncol=len(handles),
            fontsize=8,
            frameon=False,
            borderaxespad=0.2,
        )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=140)
    plt.close(fig)
    LOGGER.info("timeline: %s", out)
    return out
