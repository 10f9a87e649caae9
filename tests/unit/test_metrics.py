"""The metrics publisher: rejected requests by reason, one series per reason, published as deltas."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from inflight.runtime.metrics import CALLS_PER_EXECUTE, HISTOGRAM_SAMPLE, MetricsPublisher
from inflight.runtime.pipeline import AutoStats, ExecutorStats


class _Metric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.value = 0.0
        self.calls = 0  # each call is a round trip to the server process in Triton's Python backend
        self.observed: list[float] = []

    def increment(self, delta: float) -> None:
        self.calls += 1
        self.value += delta

    def set(self, value: float) -> None:
        self.calls += 1
        self.value = value

    def observe(self, value: float) -> None:
        self.calls += 1
        self.value += 1
        self.observed.append(value)


class _Family:
    """Stands in for ``pb_utils.MetricFamily``: records every metric it makes."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: list[tuple[str, _Metric]] = []

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict[str, str], buckets: Any = None) -> _Metric:
        m = _Metric(labels)
        _Family.made.append((self.name, m))
        return m


def _rejected(reason: str) -> list[_Metric]:
    return [m for n, m in _Family.made if n == "inflight_rejected_requests_total" and m.labels["reason"] == reason]


def test_rejected_requests_are_published_by_reason() -> None:
    _Family.made = []
    rejected: Counter[str] = Counter()
    pub = MetricsPublisher(
        SimpleNamespace(MetricFamily=_Family),
        model="bert_tiny_sync",
        instance="bert_tiny_sync_0_0",
        stats=ExecutorStats(),
        in_flight=lambda: 0,
        slots=1,
        rejected=rejected,
    )
    pub.publish(force=True)
    assert not _rejected("dtype"), "no series before the first rejection"
    rejected["dtype"] += 2
    rejected["empty_batch"] += 1
    pub.publish(force=True)
    rejected["dtype"] += 1
    pub.publish(force=True)
    pub.publish(force=True)  # nothing new: no increment
    (dtype,) = _rejected("dtype")
    (empty,) = _rejected("empty_batch")
    assert dtype.value == 3 and empty.value == 1
    assert dtype.labels["model"] == "bert_tiny_sync" and "pid" in dtype.labels


def test_a_publication_costs_a_bounded_number_of_calls_whatever_the_batches_since_the_last() -> None:
    """Every metric call is a round trip (44-71 us on the CPU host): 10,000 batches must not cost 20,000.

    The histograms take a uniform sample of at most ``HISTOGRAM_SAMPLE`` batches (their mean stands), and a
    gauge unchanged since the last publication is not set again.
    """
    _Family.made = []
    stats = ExecutorStats()
    pub = MetricsPublisher(
        SimpleNamespace(MetricFamily=_Family), model="m", instance="m_0", stats=stats, in_flight=lambda: 1, slots=4
    )
    pub.publish(force=True)
    before = sum(m.calls for _, m in _Family.made)
    for i in range(10_000):
        stats.batches += 1
        stats.depth_launches[1 + i % 4] += 1  # depths 1, 2, 3, 4 alike
        stats.batch_sizes.append(100 if i % 2 else 300)  # mean 200
    pub.publish(force=True)
    by_name = {n: m for n, m in _Family.made}
    depth, size = by_name["inflight_launch_depth"], by_name["inflight_batch_size"]
    assert depth.calls == size.calls == HISTOGRAM_SAMPLE
    assert set(depth.observed) <= {1.0, 2.0, 3.0, 4.0} and set(size.observed) <= {100.0, 300.0}
    assert by_name["inflight_batches_total"].value == 10_000  # the counters stay exact
    calls = sum(m.calls for _, m in _Family.made) - before
    assert calls <= 2 * HISTOGRAM_SAMPLE + 4, calls  # the two samples, the counters that moved, nothing else
    # nothing moved: no call at all
    before = sum(m.calls for _, m in _Family.made)
    pub.publish(force=True)
    assert sum(m.calls for _, m in _Family.made) == before
    # a few batches: each is observed (no sampling below the bound)
    stats.depth_launches[2] += 3
    stats.batch_sizes.extend([7, 8, 9])
    pub.publish(force=True)
    assert depth.observed[-3:] == [2.0, 2.0, 2.0] and size.observed[-3:] == [7.0, 8.0, 9.0]


def _calls() -> int:
    return sum(m.calls for _, m in _Family.made)


def test_a_publication_is_spread_over_the_executes_after_it_counters_first() -> None:
    """No batch waits for a whole publication: each ``publish()`` makes at most ``calls_per_execute`` calls."""
    _Family.made = []
    stats, auto = ExecutorStats(), AutoStats()
    pub = MetricsPublisher(
        SimpleNamespace(MetricFamily=_Family),
        model="m",
        instance="m_0",
        stats=stats,
        more=(auto,),
        in_flight=lambda: 1,
        slots=4,
    )
    assert pub.calls_per_execute == CALLS_PER_EXECUTE == 4
    for i in range(100):
        stats.batches += 1
        stats.items += 50
        stats.launches += 1
        stats.depth_launches[1] += 1
        stats.batch_sizes.append(50 + i)
    auto.auto_gain = 1.5
    by_name = {n: m for n, m in _Family.made}
    pub.publish()  # the first publication: begins at once
    made = [_calls()]
    # the counters go first: the three that moved are current after this first call
    counters = ("inflight_batches_total", "inflight_items_total", "inflight_launches_total")
    assert [by_name[n].value for n in counters] == [100, 5000, 100] and made == [4]
    while pub._pending:
        pub.publish()  # not forced, and within the interval: only the rest of the publication
        made.append(_calls())
    steps = [b - a for a, b in zip([0, *made], made, strict=False)]
    assert all(0 < n <= 4 for n in steps), steps
    assert by_name["inflight_batch_size"].calls == HISTOGRAM_SAMPLE
    # 3 counters, 4 gauges (the three of auto, first seen, and in-flight), the two histograms' samples
    assert made[-1] == 3 + 4 + 2 * HISTOGRAM_SAMPLE
    figures = pub.figures
    assert figures["publications"] == 1 and figures["metric_calls"] == made[-1] and figures["publish_max_ms"] > 0
    # the interval has not passed: nothing more
    stats.batches += 1
    pub.publish()
    assert _calls() == made[-1]


def test_a_failing_metric_call_drops_that_update_and_never_fails_the_batch() -> None:
    _Family.made = []
    stats = ExecutorStats()
    pub = MetricsPublisher(
        SimpleNamespace(MetricFamily=_Family), model="m", instance="m_0", stats=stats, in_flight=lambda: 0, slots=1
    )
    by_name = {n: m for n, m in _Family.made}

    def broken(delta: float) -> None:
        raise RuntimeError("the server refused it")

    by_name["inflight_batches_total"].increment = broken  # type: ignore[method-assign]
    stats.batches, stats.items = 3, 30
    pub.publish(force=True)
    assert by_name["inflight_items_total"].value == 30 and not pub._pending
    # the failures pushed at the end of an execute() that counted some: the same rule, the others still made
    by_name["inflight_error_responses_total"].increment = broken  # type: ignore[method-assign]
    stats.error_responses, stats.failed_batches = 2, 1
    pub.publish_failures()
    assert by_name["inflight_failed_batches_total"].value == 1 and not pub._pending


def test_the_auto_policys_counters_are_published_only_beside_an_auto_policy() -> None:
    """Without a policy no ``inflight_auto_*`` family is made; with one, they are read from its ``AutoStats``."""
    _Family.made = []
    MetricsPublisher(
        SimpleNamespace(MetricFamily=_Family),
        model="m",
        instance="m_0",
        stats=ExecutorStats(),
        in_flight=lambda: 0,
        slots=1,
    )
    assert not [n for n, _ in _Family.made if n.startswith("inflight_auto_") or n == "inflight_deferred_requests_total"]
    _Family.made = []
    auto = AutoStats()
    pub = MetricsPublisher(
        SimpleNamespace(MetricFamily=_Family),
        model="m",
        instance="m_0",
        stats=ExecutorStats(),
        more=(auto,),
        in_flight=lambda: 0,
        slots=1,
    )
    auto.auto_deferred, auto.deferred_requests, auto.auto_bound = 3, 12, 1.6
    pub.publish(force=True)
    by_name = dict(_Family.made)
    assert by_name["inflight_auto_deferred_batches_total"].value == 3
    assert by_name["inflight_deferred_requests_total"].value == 12
    assert by_name["inflight_auto_overlap_bound"].value == 1.6
