"""Interval arithmetic: union, clip, busy fraction, gaps -- exact, against a brute-force model."""

from __future__ import annotations

import numpy as np
import pytest

from inflight.profiling import intervals as iv


def arr(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


def pairs(s: np.ndarray, e: np.ndarray) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in zip(s, e, strict=True)]


def brute_cover(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Boolean timeline of [lo, hi): True where some half-open interval covers the unit cell."""
    t = np.zeros(hi - lo, dtype=bool)
    for s, e in zip(starts, ends, strict=True):
        a, b = max(int(s), lo), min(int(e), hi)
        if b > a:
            t[a - lo : b - lo] = True
    return t


def runs(mask: np.ndarray, lo: int, value: bool) -> list[tuple[int, int]]:
    out, i = [], 0
    while i < mask.size:
        if mask[i] == value:
            j = i
            while j < mask.size and mask[j] == value:
                j += 1
            out.append((lo + i, lo + j))
            i = j
        else:
            i += 1
    return out


# -- union -------------------------------------------------------------------------------------


def test_union_of_overlapping_intervals_merges_them():
    s, e = iv.union(arr(0, 5), arr(10, 15))
    assert pairs(s, e) == [(0, 15)]


def test_union_of_nested_intervals_is_the_outer_one():
    s, e = iv.union(arr(0, 2, 3), arr(100, 10, 50))
    assert pairs(s, e) == [(0, 100)]


def test_touching_intervals_merge_without_a_gap():
    s, e = iv.union(arr(0, 5, 9), arr(5, 9, 12))
    assert pairs(s, e) == [(0, 12)]
    gs, ge = iv.gaps(arr(0, 5), arr(5, 9), 0, 9)
    assert gs.size == 0 and ge.size == 0


def test_disjoint_intervals_stay_apart_and_come_out_sorted():
    s, e = iv.union(arr(20, 0, 10), arr(25, 5, 12))
    assert pairs(s, e) == [(0, 5), (10, 12), (20, 25)]


def test_union_of_nothing_is_empty_and_keeps_dtype():
    s, e = iv.union(arr(), arr())
    assert s.size == 0 and e.size == 0 and s.dtype == np.int64
    assert iv.total_length(arr(), arr()) == 0


def test_empty_intervals_are_dropped():
    s, e = iv.union(arr(3, 0), arr(3, 1))
    assert pairs(s, e) == [(0, 1)]


def test_interval_ending_before_it_starts_is_rejected():
    with pytest.raises(ValueError, match="ends before it starts"):
        iv.union(arr(5), arr(4))


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="same length"):
        iv.union(arr(1, 2), arr(3))


def test_a_later_short_interval_inside_a_long_one_does_not_split_it():
    # running maximum of the ends: [0,100) covers [10,20) and [30,40) that come after it
    s, e = iv.union(arr(0, 10, 30, 150), arr(100, 20, 40, 160))
    assert pairs(s, e) == [(0, 100), (150, 160)]


def test_large_nanosecond_timestamps_stay_exact():
    base = 1_700_000_000_000_000_000  # ~ 2023 in ns since the epoch: beyond float64's exact range
    s, e = iv.union(arr(base, base + 1), arr(base + 1, base + 3))
    assert pairs(s, e) == [(base, base + 3)]
    assert iv.total_length(arr(base, base + 1), arr(base + 1, base + 3)) == 3


# -- clip --------------------------------------------------------------------------------------


def test_clip_cuts_intervals_at_the_window_edges():
    s, e = iv.clip(arr(0, 5, 20), arr(10, 30, 40), 5, 25)
    assert pairs(s, e) == [(5, 10), (5, 25), (20, 25)]


def test_clip_drops_intervals_outside_or_only_touching_the_window():
    s, e = iv.clip(arr(0, 30, 10), arr(10, 40, 30), 10, 30)
    assert pairs(s, e) == [(10, 30)]


def test_clip_rejects_an_inverted_window():
    with pytest.raises(ValueError, match="window ends before"):
        iv.clip(arr(0), arr(1), 5, 4)


# -- busy fraction -----------------------------------------------------------------------------


def test_busy_fraction_is_union_over_wall_not_the_sum():
    # two streams fully overlapping for 50 of 100 ns: busy 50 %, while the sum would say 100 %
    assert iv.busy_fraction(arr(0, 0), arr(50, 50), 0, 100) == pytest.approx(0.5)


def test_busy_fraction_counts_only_the_part_inside_the_window():
    assert iv.busy_fraction(arr(-50), arr(50), 0, 100) == pytest.approx(0.5)
    assert iv.busy_fraction(arr(90), arr(200), 0, 100) == pytest.approx(0.1)


def test_busy_fraction_of_an_empty_window_or_no_intervals_is_zero():
    assert iv.busy_fraction(arr(0), arr(10), 5, 5) == 0.0
    assert iv.busy_fraction(arr(), arr(), 0, 100) == 0.0


def test_fully_covered_window_is_one():
    assert iv.busy_fraction(arr(0, 40), arr(60, 100), 0, 100) == 1.0


# -- gaps --------------------------------------------------------------------------------------


def test_gaps_include_leading_and_trailing_idle_time():
    gs, ge = iv.gaps(arr(10, 50), arr(20, 60), 0, 100)
    assert pairs(gs, ge) == [(0, 10), (20, 50), (60, 100)]


def test_gaps_of_an_idle_window_are_the_window():
    gs, ge = iv.gaps(arr(), arr(), 5, 9)
    assert pairs(gs, ge) == [(5, 9)]


def test_gaps_ignore_work_outside_the_window():
    gs, ge = iv.gaps(arr(0, 95), arr(15, 200), 10, 100)
    assert pairs(gs, ge) == [(15, 95)]


def test_gaps_and_busy_time_add_up_to_the_window():
    s, e = arr(3, 7, 40, 41, 90), arr(9, 12, 45, 60, 130)
    gs, ge = iv.gaps(s, e, 0, 100)
    busy = iv.busy_fraction(s, e, 0, 100) * 100
    assert busy + int((ge - gs).sum()) == pytest.approx(100)


# -- intersection --------------------------------------------------------------------------------


def test_intersection_length_of_two_sets():
    assert iv.intersection_length(arr(0, 20), arr(10, 30), arr(5, 25), arr(22, 40)) == 5 + 2 + 5


# -- valid -------------------------------------------------------------------------------------


def test_valid_rejects_zero_timestamps_and_empty_or_inverted_records():
    m = iv.valid(arr(0, 5, 5, 7), arr(10, 5, 4, 9))
    assert m.tolist() == [False, False, False, True]


# -- against a brute-force model ---------------------------------------------------------------


@pytest.mark.parametrize("seed", range(25))
def test_random_sets_match_a_brute_force_timeline(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 40))
    s = rng.integers(0, 200, n)
    e = s + rng.integers(0, 30, n)  # includes empty intervals
    lo, hi = sorted(int(x) for x in rng.integers(-20, 240, 2))
    if lo == hi:
        hi += 1
    cover = brute_cover(s, e, lo, hi)

    assert iv.busy_fraction(s, e, lo, hi) == pytest.approx(cover.mean())
    gs, ge = iv.gaps(s, e, lo, hi)
    assert pairs(gs, ge) == runs(cover, lo, False)

    us, ue = iv.union(s, e)
    full_lo, full_hi = -1, 300
    assert pairs(us, ue) == runs(brute_cover(s, e, full_lo, full_hi), full_lo, True)
    assert iv.total_length(s, e) == int(brute_cover(s, e, full_lo, full_hi).sum())
