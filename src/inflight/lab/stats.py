"""The statistics the lab's decisions use, in one place.

Capacities and p99s move with the host from one window to the next, so the reports read several searches
(or interleaved rounds) of each side: their medians where each side has two or more (:func:`judged`),
ratios of those (:func:`capacity_ratio`, :func:`median_ratios`), and how likely a gap that large is by chance
(:func:`permutation_p` for two groups of values, :func:`sign_p` for rounds paired across sides).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence


def judged(*sides: Sequence[float]) -> tuple[list[float], bool]:
    """Each side's capacity as the reports read it (its median, or its best search) and whether medians were read.

    Medians where every side was searched at least twice, else each side's best search.

    One search moves with the host (two searches of the default in `20261126-h100-4cores-abba`: 4,750 and
    6,000), so where a sitting searched each side several times, interleaved, the medians are compared; with
    one search a side, the best ones. Every side must hold a search.
    """
    medians = all(len(side) >= 2 for side in sides)
    return [statistics.median(side) if medians else max(side) for side in sides], medians


def capacity_ratio(sync: Sequence[float], pipelined: Sequence[float]) -> float | None:
    """Pipelined over sync capacity, as :func:`judged` reads them (None when a side was not searched)."""
    if not sync or not pipelined:
        return None
    (s, p), _ = judged(sync, pipelined)
    return p / s


#: Most relabellings :func:`permutation_p` enumerates (C(16, 8) = 12,870: eight searches or rounds a side).
PERMUTATIONS_MAX = 20_000


def permutation_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided exact permutation p of the difference between the medians of ``a`` and ``b``.

    The share of all ways to split the pooled values into groups of ``len(a)`` and ``len(b)`` whose medians
    differ by at least as much as the two measured groups do: how often labelling the same searches (or
    rounds) at random gives a gap as large. The measured split and its mirror always count, so two searches a
    side give no p under 1/3 (three a side: 1/10; four: 1/35, and medians that ignore the extremes make even
    fully separated groups 2/35). None when a side holds fewer than two values or the splits exceed
    :data:`PERMUTATIONS_MAX`.
    """
    if len(a) < 2 or len(b) < 2 or math.comb(len(a) + len(b), len(a)) > PERMUTATIONS_MAX:
        return None
    pooled = [*a, *b]
    observed = abs(statistics.median(a) - statistics.median(b))
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        picked = set(chosen)
        x = [pooled[i] for i in chosen]
        y = [v for i, v in enumerate(pooled) if i not in picked]
        total += 1
        hits += abs(statistics.median(x) - statistics.median(y)) >= observed * (1 - 1e-9)
    return hits / total


def sign_p(above: int, below: int) -> float | None:
    """Two-sided exact sign test: how likely a split at least this uneven is when either side is as likely."""
    n = above + below
    if n == 0:
        return None
    k = max(above, below)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n)


def median_ratios(rounds: Mapping[float, tuple[list[float], list[float]]]) -> dict[float, float]:
    """Per rate, the median of the other side's rounds over the median of sync's."""
    return {rate: statistics.median(p) / statistics.median(s) for rate, (s, p) in sorted(rounds.items())}


def share_of_best(side: Sequence[float], *others: Sequence[float]) -> tuple[float, bool] | None:
    """``side``'s capacity over the best of ``others`` (those searched), as :func:`judged` reads them.

    Returns the share and whether medians were compared; None when ``side`` or every other was not searched.
    """
    rivals = [o for o in others if o]
    if not side or not rivals:
        return None
    (mine, *theirs), medians = judged(side, *rivals)
    return mine / max(theirs), medians
