"""Live metrics at Triton's metrics endpoint, published from the execute thread only.

Two hazards of the 2.51 custom-metrics API shape this module:

* docs/LAB.md, "Toolchain facts": metrics called from background threads segfaulted the server under load; calls
  from the execute thread were fine. The executor's threads therefore only bump plain counters
  (``ExecutorStats``); ``MetricsPublisher.publish()``, called at the start of each ``execute()``,
  turns their change since the last call into metric updates, at most every ``interval_s`` (each
  update is a round trip to the server process). When an ``execute()`` refused a request or
  counted an error (``inflight_rejected_requests_total``, ``inflight_error_responses_total``,
  ``inflight_failed_batches_total``), ``InflightModel`` publishes those again at its end
  (``publish_failures``): they are current at once, an idle server included. What remains:
  errors that sender threads answer later (pipelined batches that fail on the device, ``auto``'s
  deferred chunks), and the other counters, show at the next ``execute()``; publishing them from
  a timer would mean a background thread.
* A server segfault seen on the GPU host (2026-11-21, stack in libtritonserver under a
  libtriton_python thread) right after a model was reloaded while its old instance was still
  alive: both instances' metrics had the same family name *and* labels, so they shared one
  Prometheus series, which the old instance's finalize removed under the new one
  (triton-inference-server/server#8663, core#471). Every series therefore carries the stub's
  ``pid``: no two live instances share a series.

Every metric call is that round trip: 44-71 us each on the 2-CPU host (Triton 2.51; a Python model
timing 5,000 ``observe``/``increment``/``set`` calls in its ``execute()``,
``scripts/lab/metric_call_cost.py``, ``results/diagnostics/20261126-metric-call-cost``), all of it on the
execute thread, and longer where the server's cores are busy. So a publication is bounded, not
proportional to the batches since the last one: each histogram takes a uniform sample of at most
``HISTOGRAM_SAMPLE`` of them (their mean and shape stand; their ``_count`` is the sample's), a gauge is
set only when its value changed, and publications are ``PUBLISH_INTERVAL_S`` (0.5 s) apart at least.
And a publication is spread over the ``execute()`` calls that follow it: each makes at most
``calls_per_execute`` of its calls (counters first, then gauges, then the histograms' samples), so no
batch carries a whole publication. On four busy server cores one publication made at once took up to
11.6 ms (about 24 calls); the executes over 10 ms there were not the metrics' doing, though: they were
as many with ``metrics=false`` (LAB.md, "Four server cores: the tail is the host's scheduling").
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from inflight.model_config import BackendParameters
from inflight.runtime.pipeline import Counters, ExecutorStats
from inflight.runtime.pipeline.stats import Aggregation

LOGGER = logging.getLogger(__name__)

#: The ``ExecutorStats`` counters of errors, published with the refusals by ``MetricsPublisher.publish_failures``.
FAILURE_COUNTERS = ("error_responses", "failed_batches")

#: Seconds between two publications at least (a publication's calls are round trips to the server process).
PUBLISH_INTERVAL_S = 0.5

#: Observations each histogram takes per publication at most (a uniform sample of the batches since the last).
HISTOGRAM_SAMPLE = 8

#: Metric calls one ``execute()`` makes at most (the rest of a publication goes to the next ones; 0: no bound):
#: the backend parameter ``metric_calls_per_execute``'s default.
CALLS_PER_EXECUTE = BackendParameters.metric_calls_per_execute

#: A provider of live GPU figures: returns ``{"gpu_activity": f, "sync_share": f}`` or None.
GpuFigures = Callable[[], "dict[str, float] | None"]


class MetricsPublisher:
    """Owns the metric families of one model instance and updates them from ``ExecutorStats``.

    Args:
        pb_utils: The ``triton_python_backend_utils`` module.
        model: Model name (label).
        instance: Instance name (label).
        gpu: The instance's GPU as its process sees it (label ``gpu``; None: a CPU instance, no label).
        stats: The executor's counters.
        more: Other counter sets published beside them (the ``auto`` policy's ``AutoStats``).
        in_flight: Returns the current number of busy slots.
        slots: Ring size (histogram buckets of the in-flight depth).
        gpu_figures: Live GPU activity / sync share (CUPTI), or None.
        interval_s: Minimum time between two publications.
        calls_per_execute: Metric calls one ``publish()`` makes at most (0: the whole publication at once).
        rejected: Requests answered with INVALID_ARG, by reason (the model's counter); published as
            ``inflight_rejected_requests_total{reason=...}``, a series per reason from its first
            rejection on (Triton counts these requests as successes).
    """

    #: Each of ``figures``, and how it combines over instances (``inflight.runtime.record``).
    FIGURES: ClassVar[dict[str, Aggregation]] = {
        "publications": "sum",
        "metric_calls": "sum",
        "publish_s": "sum",
        "publish_max_ms": "max",
    }

    def __init__(
        self,
        pb_utils: Any,
        *,
        model: str,
        instance: str,
        gpu: int | None = None,
        stats: ExecutorStats,
        more: Sequence[Counters] = (),
        in_flight: Callable[[], int],
        slots: int,
        gpu_figures: GpuFigures | None = None,
        interval_s: float = PUBLISH_INTERVAL_S,
        calls_per_execute: int = CALLS_PER_EXECUTE,
        rejected: Mapping[str, int] | None = None,
    ) -> None:
        mf = pb_utils.MetricFamily
        labels = {"model": model, "instance": instance, "pid": str(os.getpid())}
        if gpu is not None:
            labels["gpu"] = str(gpu)
        self.stats = stats
        #: the counter set each published counter or gauge is read from, by field name
        self._owner: dict[str, Counters] = {}
        self.in_flight = in_flight
        self.gpu_figures = gpu_figures
        self.interval_s = interval_s
        self.calls_per_execute = calls_per_execute
        #: the calls of the current publication not made yet: (the metric's method, its argument)
        self._pending: deque[tuple[Callable[[float], Any], float]] = deque()
        #: for the finalize log: publications begun, metric calls made, seconds in ``publish()`` and its longest
        self.figures: dict[str, float] = {"publications": 0, "metric_calls": 0, "publish_s": 0.0, "publish_max_ms": 0.0}
        self._failed_logged = False
        self._last = 0.0
        self._seen: dict[str, float] = {}
        self._depth_seen = [0] * len(stats.depth_launches)
        self._gauge_seen: dict[str, float] = {}
        self._sample = random.Random(os.getpid())  # which launches the histograms sample (not security)
        self._families: list[Any] = []

        def family(name: str, desc: str, kind: Any) -> Any:
            f = mf(name=name, description=desc, kind=kind)
            self._families.append(f)
            return f

        self.m_inflight = family("inflight_in_flight", "Batches in flight in this instance now", mf.GAUGE).Metric(
            labels=labels
        )
        # every other family is described once, in ExecutorStats' field metadata
        histograms = {attr: (m.name, doc) for attr, m, doc in ExecutorStats.published("histogram")}
        name, doc = histograms["depth_launches"]
        self.m_depth = family(name, doc, mf.HISTOGRAM).Metric(
            labels=labels, buckets=[float(i) for i in range(1, slots + 1)]
        )
        name, doc = histograms["batch_sizes"]
        self.m_batch = family(name, doc, mf.HISTOGRAM).Metric(labels=labels, buckets=[float(1 << k) for k in range(12)])
        self.m_counters: dict[str, Any] = {}
        self.m_gauges: dict[str, Any] = {}
        for source in (stats, *more):
            for kind, metrics, mf_kind in (
                ("counter", self.m_counters, mf.COUNTER),
                ("gauge", self.m_gauges, mf.GAUGE),
            ):
                for attr, m, doc in type(source).published(kind):  # type: ignore[arg-type]
                    metrics[attr] = family(m.name, doc, mf_kind).Metric(labels=labels)
                    self._owner[attr] = source
        self.rejected = rejected
        self._labels = labels
        self._rejected_seen: dict[str, int] = {}
        self.m_rejected: dict[str, Any] = {}
        self.f_rejected = family(
            "inflight_rejected_requests_total",
            "Requests answered with an INVALID_ARG error, by reason (Triton counts them as successes)",
            mf.COUNTER,
        )
        self.m_gpu: dict[str, Any] = {}
        if gpu_figures is not None:
            self.m_gpu = {
                "gpu_activity": family(
                    "inflight_gpu_activity",
                    "This instance's GPU temporal activity (union of its own kernel+copy intervals / wall), CUPTI "
                    "window; set at an execute (an idle instance keeps its last value); instances sharing a GPU "
                    "time-slice it, so theirs do not add up to the GPU's activity (nsys of the server measures that)",
                    mf.GAUGE,
                ).Metric(labels=labels),
                "sync_share": family(
                    "inflight_sync_share",
                    "Share of this instance's CUDA API time in *Synchronize calls, CUPTI window",
                    mf.GAUGE,
                ).Metric(labels=labels),
            }

    def publish(self, force: bool = False) -> None:
        """Make the next calls of the publication under way, or begin one after ``interval_s`` (execute thread only).

        At most ``calls_per_execute`` calls per ``publish()``; ``force`` begins a publication now and makes all of it.
        """
        t0 = time.perf_counter()
        if not self._pending:
            now = time.monotonic()
            if not force and now - self._last < self.interval_s:
                return
            self._last = now
            self._begin()
        budget = len(self._pending) if force or self.calls_per_execute <= 0 else self.calls_per_execute
        self._make_calls(budget)
        took = time.perf_counter() - t0
        f = self.figures
        f["publish_s"] += took
        f["publish_max_ms"] = max(f["publish_max_ms"], took * 1e3)

    def _make_calls(self, budget: int) -> None:
        """Make up to ``budget`` of the queued calls, in order; a failing call drops its update (logged once)."""
        calls = 0
        while self._pending and calls < budget:
            call, value = self._pending.popleft()
            calls += 1
            try:
                call(value)
            except Exception as e:  # metrics must not fail the batch: the update is dropped, once logged
                if not self._failed_logged:
                    LOGGER.warning("a metric update failed (%s: %s); later ones are not logged", type(e).__name__, e)
                    self._failed_logged = True
        self.figures["metric_calls"] += calls

    def _begin(self) -> None:
        """Queue a publication: the change since the last one, counters first, then gauges, then the histograms."""
        self.figures["publications"] += 1
        s = self.stats
        self._push_counters(self.m_counters)
        self._push_rejected()
        for attr, metric in self.m_gauges.items():
            self._set(attr, metric, float(getattr(self._owner[attr], attr)))
        self._set("in_flight", self.m_inflight, float(self.in_flight()))
        if self.gpu_figures is not None:
            figures = self.gpu_figures()
            if figures:
                for key, metric in self.m_gpu.items():
                    if key in figures:
                        self._set(key, metric, float(figures[key]))
        counts = list(s.depth_launches)
        depths = [d for d, (n, seen) in enumerate(zip(counts, self._depth_seen, strict=True)) for _ in range(n - seen)]
        self._depth_seen = counts
        self._pending.extend((self.m_depth.observe, float(d)) for d in self._sampled(depths))
        sizes = list(s.batch_sizes)  # appended by this (the execute) thread only
        s.batch_sizes.clear()
        self._pending.extend((self.m_batch.observe, float(n)) for n in self._sampled(sizes))

    def _sampled(self, values: list[int]) -> list[int]:
        """``values`` if at most ``HISTOGRAM_SAMPLE``, else a uniform sample of that many of them."""
        return values if len(values) <= HISTOGRAM_SAMPLE else self._sample.sample(values, HISTOGRAM_SAMPLE)

    def _set(self, key: str, metric: Any, value: float) -> None:
        """Queue setting a gauge when its value changed (each call is a round trip)."""
        if self._gauge_seen.get(key) != value:
            self._pending.append((metric.set, value))
            self._gauge_seen[key] = value

    def publish_failures(self) -> None:
        """Push the refusals and errors counted since they were last queued, at once (execute thread only).

        Called at the end of an ``execute()`` that counted some, so they are current on an idle
        server; only the families that moved cost a round trip (a few, and only on an ``execute()`` that refused
        or failed something). A failing call drops its update, as in ``publish``; the others are still made.
        """
        queue, self._pending = self._pending, deque()
        try:
            self._push_counters({attr: self.m_counters[attr] for attr in FAILURE_COUNTERS})
            self._push_rejected()
            self._make_calls(len(self._pending))
        finally:
            self._pending = queue

    def _push_counters(self, metrics: Mapping[str, Any]) -> None:
        for attr, metric in metrics.items():
            value = float(getattr(self._owner[attr], attr))
            delta = value - self._seen.get(attr, 0.0)
            if delta > 0:
                self._pending.append((metric.increment, delta))
                self._seen[attr] = value

    def _push_rejected(self) -> None:
        for reason, n in (self.rejected or {}).items():
            delta = n - self._rejected_seen.get(reason, 0)
            if delta > 0:
                if reason not in self.m_rejected:
                    self.m_rejected[reason] = self.f_rejected.Metric(labels={**self._labels, "reason": reason})
                self._pending.append((self.m_rejected[reason].increment, float(delta)))
                self._rejected_seen[reason] = n

    def close(self) -> None:
        """Drop the metric families (they are removed from the endpoint)."""
        self._families.clear()
