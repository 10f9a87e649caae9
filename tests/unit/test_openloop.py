"""The open-loop pieces that need no server: arrival schedule, lateness, SLO, capacity search, CPU sets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inflight.errors import ConfigError
from inflight.loadtest import list_options, schedule
from inflight.loadtest import openloop as ol


def test_poisson_schedule_offers_the_rate_with_exponential_gaps() -> None:
    rate, duration = 2000.0, 50.0
    t = schedule.Schedule(rate, seed=3).offsets(duration)
    assert np.all(np.diff(t) > 0) and t[0] > 0 and t[-1] < duration
    n = len(t)
    # a Poisson count over 50 s at 2000/s: mean 100,000, sd ~316; 5 sd either side
    assert abs(n - rate * duration) < 5 * math.sqrt(rate * duration)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # exponential: CV 1
    counts = np.bincount((t * 10).astype(int), minlength=int(duration * 10))  # 100 ms bins
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.15)  # Poisson: variance = mean


def test_schedules_are_reproducible_and_sources_independent() -> None:
    a = schedule.Schedule(500, seed=7, index=1, sources=4).offsets(10)
    b = schedule.Schedule(500, seed=7, index=1, sources=4).offsets(10)
    c = schedule.Schedule(500, seed=7, index=2, sources=4).offsets(10)
    d = schedule.Schedule(500, seed=8, index=1, sources=4).offsets(10)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[:100], c[:100]) and not np.array_equal(a[:100], d[:100])
    # each of 4 sources offers a quarter; together they offer the rate
    merged = np.sort(np.concatenate([schedule.Schedule(500, seed=7, index=i, sources=4).offsets(10) for i in range(4)]))
    assert abs(len(merged) - 5000) < 5 * math.sqrt(5000)
    assert abs(len(a) - 1250) < 5 * math.sqrt(1250)


def test_constant_sources_interleave_into_one_even_stream() -> None:
    merged = np.sort(
        np.concatenate([schedule.Schedule(1000, dist="constant", index=i, sources=4).offsets(1.0) for i in range(4)])
    )
    assert len(merged) == 1000
    assert np.allclose(np.diff(merged), 1e-3)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"rate": 0}, "positive"),
        ({"rate": float("nan")}, "positive"),
        ({"rate": 10, "dist": "bursty"}, "poisson, constant"),
        ({"rate": 10, "index": 4, "sources": 4}, "0..3"),
    ],
)
def test_schedule_refuses_bad_arguments(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        schedule.Schedule(**kwargs)  # type: ignore[arg-type]


def test_lateness_counts_late_sends_answers_in_the_window_and_the_backlog() -> None:
    c = ol.Lateness(started=100.0)
    c.sent(0.0005)  # on time (under the 2 ms threshold)
    c.sent(0.004)  # late
    c.sent(0.020)  # very late
    c.sent(-0.001)  # early counts as on time
    assert (c.scheduled, c.late, c.very_late, c.inflight, c.peak_inflight) == (4, 2, 1, 4, 4)
    assert c.max_late_ms == pytest.approx(20.0)
    c.done(True)
    c.done(False)
    c.stop(102.0)
    c.done(True)  # answered after the window: not achieved
    assert (c.completed, c.ok, c.inflight, c.span_s) == (2, 1, 1, 2.0)
    total = ol.Lateness.combine([c.to_dict(), ol.Lateness(started=0.0, span_s=2.0, scheduled=4, ok=4).to_dict()])
    assert total["scheduled"] == 8 and total["ok"] == 5 and total["unanswered"] == 1
    assert total["late_fraction"] == pytest.approx(2 / 8) and total["very_late_fraction"] == pytest.approx(1 / 8)
    assert total["achieved_rps"] == pytest.approx(5 / 2.0)
    assert total["answered_fraction"] == pytest.approx(5 / 8)
    assert total["mean_late_ms"] == pytest.approx((0.5 + 4 + 20 + 0) / 8)


def test_lateness_reset_keeps_what_is_in_flight() -> None:
    c = ol.Lateness(started=0.0)
    c.sent(0.05)
    c.sent(0.0)
    c.done(True)
    c.reset(5.0)
    assert (c.scheduled, c.late, c.completed, c.inflight, c.peak_inflight, c.started) == (0, 0, 0, 1, 1, 5.0)
    c.done(True)  # the request from before the reset is answered in the window
    assert (c.ok, c.inflight) == (1, 0)


def _point(rate: float, p99: float, *, answered: float = 1.0, failures: int = 0, valid: bool = True) -> ol.RatePoint:
    return ol.RatePoint(
        offered_rps=rate,
        achieved_rps=rate * answered,
        requests=int(rate * 10),
        failures=failures,
        p50_ms=p99 / 3,
        p95_ms=p99 / 1.5,
        p99_ms=p99,
        answered_fraction=answered,
        valid=valid,
    )


def test_slo_failures_name_each_reason() -> None:
    assert ol.slo_failures(_point(1000, 49.9), 50) == []
    why = ol.slo_failures(_point(1000, 80, answered=0.9, failures=3, valid=False), 50)
    assert any("invalid" in w for w in why)
    assert any("3 failed" in w for w in why)
    assert any("p99 80.0 ms > 50 ms" in w for w in why)
    assert any("90.0% of the requests due" in w for w in why)
    assert not ol.meets_slo(_point(1000, math.nan), 50)
    # without the generator's answered fraction, the achieved rate decides
    p = ol.RatePoint(
        offered_rps=1000, achieved_rps=970, requests=1, failures=0, p50_ms=1, p95_ms=1, p99_ms=1, valid=True
    )
    assert ol.slo_failures(p, 50) == ["achieved 970 req/s < 98% of the offered 1,000"]


def test_capacity_is_where_the_curve_first_crosses_the_slo() -> None:
    points = [_point(1000, 5), _point(2000, 8), _point(3000, 70), _point(4000, 20)]  # 4000 passing is noise
    assert ol.capacity_of(points, 50) == 2000
    assert ol.capacity_of([_point(1000, 60)], 50) is None
    assert ol.capacity_of([], 50) is None


def test_capacity_over_rounds_is_the_median_rounds_not_the_luckiest_window() -> None:
    # an H100, 2026-11-28: 5,250 req/s met in round 1 (p99 98.7 ms) and missed in rounds 2 and 3 (107 ms)
    rounds = [
        [_point(5000, 33.9), _point(5250, 98.7)],
        [_point(5000, 33.8), _point(5250, 107.0)],
        [_point(5000, 33.8), _point(5250, 107.4)],
    ]
    assert ol.capacity_of([p for r in rounds for p in r], 100) == 5250  # pooled: the first 5,250 window decides
    assert ol.capacity_over_rounds(rounds, 100) == (5000, 5250)
    # two rounds of three meeting it carry the rate; none missing above: unbounded
    assert ol.capacity_over_rounds([[_point(100, 5)], [_point(100, 500)], [_point(100, 7)]], 50) == (100, None)
    # the median round met nothing: no capacity, the lowest rate that missed is the bound
    assert ol.capacity_over_rounds([[_point(100, 60)], [_point(100, 70)], [_point(100, 7)]], 50) == (None, 100)
    # one round is capacity_of
    one = [_point(1000, 5), _point(2000, 8), _point(3000, 70)]
    assert ol.capacity_over_rounds([one], 50) == (ol.capacity_of(one, 50), 3000)
    assert ol.capacity_over_rounds([], 50) == (None, None)


def _knee(capacity: float) -> tuple[list[float], object]:
    """A synthetic server: p99 rises like 1/(1 - rho) and passes the SLO just above ``capacity``."""
    measured: list[float] = []

    def measure(rate: float) -> ol.RatePoint:
        measured.append(rate)
        rho = rate / (capacity * 1.05)
        p99 = 5.0 / (1.0 - rho) if rho < 1 else 10_000.0
        return _point(rate, p99, answered=1.0 if rho < 1 else 0.8)

    return measured, measure


@pytest.mark.parametrize("capacity", [3_000.0, 15_000.0, 23_500.0])
def test_bisection_finds_the_capacity_within_tolerance(capacity: float) -> None:
    measured, measure = _knee(capacity)
    # p99 = 50 ms where rho = 0.9, i.e. at 0.945 x capacity
    truth = 0.9 * capacity * 1.05
    result = ol.bisect_capacity(measure, 1_000, 40_000, slo_ms=50, rel_tol=0.03, max_steps=10)  # type: ignore[arg-type]
    assert result.bounded and result.capacity_rps is not None and result.upper_rps is not None
    assert result.capacity_rps <= truth <= result.upper_rps
    assert (result.upper_rps - result.capacity_rps) <= 0.03 * result.capacity_rps
    assert measured[0] == 40_000 and measured[1] == 1_000  # the high end first, then the low end
    assert len(result.points) == len(measured) <= 12


def test_bisection_reports_a_lower_bound_and_no_capacity() -> None:
    _, easy = _knee(1e9)
    r = ol.bisect_capacity(easy, 100, 200)  # type: ignore[arg-type]
    assert (r.capacity_rps, r.upper_rps, r.bounded, len(r.points)) == (200, None, False, 1)
    measured, hard = _knee(10)
    r = ol.bisect_capacity(hard, 1_000, 2_000, max_steps=3)  # type: ignore[arg-type]
    assert r.capacity_rps is None and r.upper_rps == 125 and measured == [2000, 1000, 500, 250, 125]
    # the low end fails but a lower rate passes: the search halves down, then bisects up
    measured, mid = _knee(600)
    r = ol.bisect_capacity(mid, 1_000, 2_000, rel_tol=0.05, max_steps=8)  # type: ignore[arg-type]
    assert r.capacity_rps is not None and 500 <= r.capacity_rps <= 0.9 * 600 * 1.05 <= (r.upper_rps or 0)
    with pytest.raises(ConfigError, match="0 < low < high"):
        ol.bisect_capacity(mid, 2_000, 1_000)  # type: ignore[arg-type]


def test_cpu_lists_parse_and_format() -> None:
    assert list_options.parse_cpus("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert ol.format_cpus([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert ol.format_cpus(list_options.parse_cpus("16-31")) == "16-31"
    for bad in ("", "a-b", "3-1", "-1"):
        with pytest.raises(ConfigError, match="CPU list"):
            list_options.parse_cpus(bad)


def test_split_cpus_halves_a_large_host_and_leaves_a_small_one_alone() -> None:
    sets = ol.split_cpus(range(32))
    assert sets.isolated and sets.server == tuple(range(16)) and sets.client == tuple(range(16, 32))
    assert sets.to_dict()["server"] == "0-15" and sets.to_dict()["client"] == "16-31"
    small = ol.split_cpus(range(2))
    assert not small.isolated and small.server == () and "shares the server's cores" in small.reason
    odd = ol.split_cpus([0, 1, 2, 3, 4, 5, 6, 7, 8])
    assert odd.server == (0, 1, 2, 3) and odd.client == (4, 5, 6, 7, 8)


def test_split_cpus_takes_given_sets_and_refuses_bad_ones() -> None:
    sets = ol.split_cpus(range(8), server="0-1")
    assert sets.server == (0, 1) and sets.client == tuple(range(2, 8)) and sets.reason == "given on the command line"
    sets = ol.split_cpus(range(8), client="6-7")
    assert sets.server == tuple(range(6)) and sets.isolated
    with pytest.raises(ConfigError, match="overlap on 3"):
        ol.split_cpus(range(8), server="0-3", client="3-7")
    with pytest.raises(ConfigError, match="not all of these cores are available"):
        ol.split_cpus(range(8), server="0-9")
    with pytest.raises(ConfigError, match="at least one core"):
        ol.split_cpus(range(4), server="0-3")


def test_rates_parse_with_thousands_sorted_and_unique() -> None:
    assert list_options.parse_rates("4k,1000,2.5k,1000") == [1000.0, 2500.0, 4000.0]
    for bad in ("", "fast", "0", "-5", "1k,x"):
        with pytest.raises(ConfigError, match="--rate"):
            list_options.parse_rates(bad)
