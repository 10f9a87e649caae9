"""The metrics publisher: rejected requests by reason, one series per reason, published as deltas."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from inflight.runtime.executor import ExecutorStats
from inflight.runtime.metrics import MetricsPublisher


class _Metric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.value = 0.0

    def increment(self, delta: float) -> None:
        self.value += delta

    def set(self, value: float) -> None:
        self.value = value

    def observe(self, value: float) -> None:
        self.value += 1


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
