"""Exact, vectorised arithmetic on half-open time intervals ``[start, end)``.

GPU temporal activity is the *union* of kernel and copy intervals over the wall time of a
window, not their sum: two kernels that overlap on different streams keep the GPU busy once.
Everything here works on two parallel numpy arrays (``starts``, ``ends``), integer nanoseconds
in practice (exact), any real dtype in principle.

Conventions:
    * Intervals are half-open, so ``[0, 5)`` and ``[5, 9)`` *touch*: their union is ``[0, 9)``
      and there is no gap between them.
    * Empty intervals (``end == start``) contribute nothing and are dropped.
    * ``end < start`` is a caller bug (or an incomplete CUPTI record) and raises ``ValueError``;
      filter such records first with :func:`valid`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]

__all__ = [
    "busy_fraction",
    "clip",
    "gaps",
    "intersection_length",
    "total_length",
    "union",
    "valid",
]


def _pair(starts: npt.ArrayLike, ends: npt.ArrayLike) -> tuple[Array, Array]:
    s = np.asarray(starts)
    e = np.asarray(ends)
    if s.shape != e.shape or s.ndim != 1:
        raise ValueError(f"starts and ends must be 1-D arrays of the same length (got {s.shape} and {e.shape})")
    if s.size and bool(np.any(e < s)):
        bad = int(np.argmax(e < s))
        raise ValueError(
            f"interval {bad} ends before it starts ({s[bad]} > {e[bad]}); drop invalid records with valid() first"
        )
    return s, e


def valid(starts: npt.ArrayLike, ends: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Mask of usable records: positive start and ``end > start``.

    CUPTI marks records whose timestamps could not be collected (or that were flushed before
    they completed) with zero timestamps; those, and zero-length records, are not usable.

    Args:
        starts: Start times.
        ends: End times.

    Returns:
        A boolean mask, True where the record can be used.
    """
    s = np.asarray(starts)
    e = np.asarray(ends)
    return (s > 0) & (e > s)


def union(starts: npt.ArrayLike, ends: npt.ArrayLike) -> tuple[Array, Array]:
    """Merge intervals into the sorted, disjoint, non-touching set that covers the same time.

    Vectorised: sort by start, take the running maximum of the ends, and open a new merged
    interval wherever a start lies strictly after every end seen so far.

    Args:
        starts: Start times.
        ends: End times (same length).

    Returns:
        ``(starts, ends)`` of the union, sorted by start; consecutive intervals are separated by
        a gap of positive length.

    Raises:
        ValueError: if the arrays differ in shape or some interval ends before it starts.
    """
    s, e = _pair(starts, ends)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s.copy(), e.copy()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]  # touching (==) merges
    first = np.flatnonzero(new)
    last = np.empty_like(first)
    last[:-1] = first[1:] - 1
    last[-1] = s.size - 1
    return s[first], reach[last]


def clip(starts: npt.ArrayLike, ends: npt.ArrayLike, lo: float, hi: float) -> tuple[Array, Array]:
    """Intersect every interval with the window ``[lo, hi)``; drop what falls outside.

    Args:
        starts: Start times.
        ends: End times.
        lo: Window start.
        hi: Window end (``hi >= lo``).

    Returns:
        The clipped intervals, in input order, empty ones removed (not merged).

    Raises:
        ValueError: if ``hi < lo`` or an interval ends before it starts.
    """
    if hi < lo:
        raise ValueError(f"window ends before it starts ({lo} > {hi})")
    s, e = _pair(starts, ends)
    cs = np.maximum(s, lo)
    ce = np.minimum(e, hi)
    keep = ce > cs
    return cs[keep], ce[keep]


def total_length(starts: npt.ArrayLike, ends: npt.ArrayLike) -> int | float:
    """Length of the union (time covered by at least one interval).

    Args:
        starts: Start times.
        ends: End times.

    Returns:
        The covered time, an ``int`` for integer input.
    """
    us, ue = union(starts, ends)
    total = (ue - us).sum()
    return int(total) if np.issubdtype(np.asarray(total).dtype, np.integer) else float(total)


def busy_fraction(starts: npt.ArrayLike, ends: npt.ArrayLike, lo: float, hi: float) -> float:
    """Share of the window ``[lo, hi)`` covered by the union of the intervals.

    Args:
        starts: Start times.
        ends: End times.
        lo: Window start.
        hi: Window end.

    Returns:
        A value in ``[0, 1]``; 0.0 for an empty window.
    """
    if hi <= lo:
        return 0.0
    cs, ce = clip(starts, ends, lo, hi)
    return float(total_length(cs, ce)) / float(hi - lo)


def gaps(starts: npt.ArrayLike, ends: npt.ArrayLike, lo: float, hi: float) -> tuple[Array, Array]:
    """Idle intervals of the window ``[lo, hi)``: its complement of the union.

    A leading gap (from ``lo`` to the first interval) and a trailing gap (from the last one
    to ``hi``) are included; touching intervals leave no gap.

    Args:
        starts: Start times.
        ends: End times.
        lo: Window start.
        hi: Window end.

    Returns:
        ``(starts, ends)`` of the gaps, sorted; the whole window when there are no intervals.
    """
    cs, ce = clip(starts, ends, lo, hi)
    us, ue = union(cs, ce)
    dtype = np.result_type(us.dtype, np.asarray(lo).dtype, np.asarray(hi).dtype)
    gs = np.concatenate([np.asarray([lo], dtype=dtype), ue.astype(dtype)])
    ge = np.concatenate([us.astype(dtype), np.asarray([hi], dtype=dtype)])
    keep = ge > gs
    return gs[keep], ge[keep]


def intersection_length(
    a_starts: npt.ArrayLike, a_ends: npt.ArrayLike, b_starts: npt.ArrayLike, b_ends: npt.ArrayLike
) -> int | float:
    """Time covered by both interval sets (e.g. GPU busy time inside NVTX ranges).

    Uses ``|A and B| = |A| + |B| - |A or B|`` on the unions, so it is exact and vectorised.

    Args:
        a_starts: Starts of the first set.
        a_ends: Ends of the first set.
        b_starts: Starts of the second set.
        b_ends: Ends of the second set.

    Returns:
        The overlap length.
    """
    a_s, a_e = union(a_starts, a_ends)
    b_s, b_e = union(b_starts, b_ends)
    both = total_length(np.concatenate([a_s, b_s]), np.concatenate([a_e, b_e]))
    return total_length(a_s, a_e) + total_length(b_s, b_e) - both
