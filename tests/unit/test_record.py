"""The ``finalized`` record's figures: each owner declares what it logs and how it combines over instances."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from inflight.loadtest.executor_stats import executor_stats_from_log
from inflight.runtime.gcwatch import GcWatch
from inflight.runtime.metrics import MetricsPublisher
from inflight.runtime.pipeline import AutoStats, ExecutorStats
from inflight.runtime.probes import ExecuteTiming, GilProbe
from inflight.runtime.record import FIGURES, RETIRED, combine

FIXTURES = Path(__file__).parent / "fixtures"


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def Metric(self, labels: dict[str, str], buckets: object = None) -> SimpleNamespace:
        return SimpleNamespace(increment=lambda d: None, set=lambda v: None, observe=lambda v: None)


def test_each_owner_declares_exactly_the_figures_it_logs() -> None:
    assert set(ExecuteTiming().figures) == set(ExecuteTiming.FIGURES)
    probe = GilProbe(period_s=0.001)
    assert set(probe.stop()) == set(GilProbe.FIGURES)
    assert set(GcWatch().stop()) == set(GcWatch.FIGURES)
    pub = MetricsPublisher(
        SimpleNamespace(MetricFamily=_Family),
        model="m",
        instance="m_0",
        stats=ExecutorStats(),
        in_flight=lambda: 0,
        slots=1,
        rejected={},
    )
    assert set(pub.figures) == set(MetricsPublisher.FIGURES)
    for owner in (ExecutorStats, AutoStats):
        numbers = {k for k, v in owner().snapshot().items() if isinstance(v, (int, float))}
        assert numbers == set(owner.aggregations())
        assert numbers <= set(FIGURES)
    assert ExecutorStats.aggregations()["build_max_s"] == "max" and AutoStats.aggregations()["auto_busy"] == "mean"
    assert not set(ExecutorStats.aggregations()) & set(AutoStats.aggregations())  # each figure has one owner


def test_a_real_servers_records_carry_only_declared_figures() -> None:
    records = executor_stats_from_log((FIXTURES / "finalize-lines.log").read_text())
    assert records
    for r in records:
        numbers = {k for k, v in r["stats"].items() if isinstance(v, (int, float))}
        assert numbers <= set(FIGURES) | set(RETIRED), numbers - set(FIGURES)


def test_figures_combine_as_their_owners_declare() -> None:
    a = {"batches": 10, "execute_max_ms": 4.0, "auto_busy": 0.6, "gc_max_ms": 1.0}
    b = {"batches": 5, "execute_max_ms": 9.0, "gc_max_ms": 0.5}  # no auto_busy: counts as 0 in the mean
    c = combine([a, b])
    assert c["batches"] == 15 and c["execute_max_ms"] == 9.0 and c["gc_max_ms"] == 1.0
    assert c["auto_busy"] == pytest.approx(0.3)
    assert c.get("auto_gain") is None and "auto_gain" not in c
    with pytest.raises(KeyError, match="not a figure of the finalized record"):
        c.get("batchez")
