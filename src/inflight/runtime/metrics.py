"""Live metrics at Triton's metrics endpoint, published from the execute thread only.

Two hazards of the 2.51 custom-metrics API shape this module:

* docs/LAB.md, "Toolchain facts": metrics called from background threads segfaulted the server under load; calls
  from the execute thread were fine. The executor's threads therefore only bump plain counters
  (``ExecutorStats``); ``MetricsPublisher.publish()``, called at the start of each ``execute()``,
  turns their change since the last call into metric updates, at most every ``interval_s`` (each
  update is a round trip to the server process).
* A server segfault seen on the GPU host (2026-11-21, stack in libtritonserver under a
  libtriton_python thread) right after a model was reloaded while its old instance was still
  alive: both instances' metrics had the same family name *and* labels, so they shared one
  Prometheus series, which the old instance's finalize removed under the new one
  (triton-inference-server/server#8663, core#471). Every series therefore carries the stub's
  ``pid``: no two live instances share a series.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from inflight.runtime.executor import ExecutorStats

LOGGER = logging.getLogger(__name__)

#: A provider of live GPU figures: returns ``{"gpu_activity": f, "sync_share": f}`` or None.
GpuFigures = Callable[[], "dict[str, float] | None"]


class MetricsPublisher:
    """Owns the metric families of one model instance and updates them from ``ExecutorStats``.

    Args:
        pb_utils: The ``triton_python_backend_utils`` module.
        model: Model name (label).
        instance: Instance name (label).
        stats: The executor's counters.
        in_flight: Returns the current number of busy slots.
        slots: Ring size (histogram buckets of the in-flight depth).
        gpu_figures: Live GPU activity / sync share (CUPTI), or None.
        interval_s: Minimum time between two publications.
        rejected: Requests answered with INVALID_ARG, by reason (the model's counter); published as
            ``inflight_rejected_requests_total{reason=...}``, a series per reason from its first
            rejection on (Triton counts these requests as successes).
    """

    def __init__(
        self,
        pb_utils: Any,
        *,
        model: str,
        instance: str,
        stats: ExecutorStats,
        in_flight: Callable[[], int],
        slots: int,
        gpu_figures: GpuFigures | None = None,
        interval_s: float = 0.1,
        rejected: Mapping[str, int] | None = None,
    ) -> None:
        mf = pb_utils.MetricFamily
        labels = {"model": model, "instance": instance, "pid": str(os.getpid())}
        self.stats = stats
        self.in_flight = in_flight
        self.gpu_figures = gpu_figures
        self.interval_s = interval_s
        self._last = 0.0
        self._seen: dict[str, float] = {}
        self._depth_seen = [0] * len(stats.depth_launches)
        self._families: list[Any] = []

        def family(name: str, desc: str, kind: Any) -> Any:
            f = mf(name=name, description=desc, kind=kind)
            self._families.append(f)
            return f

        self.m_inflight = family("inflight_in_flight", "Batches in flight in this instance now", mf.GAUGE).Metric(
            labels=labels
        )
        self.m_depth = family(
            "inflight_launch_depth", "Batches in flight (incl. the new one) at each launch", mf.HISTOGRAM
        ).Metric(labels=labels, buckets=[float(i) for i in range(1, slots + 1)])
        self.m_batch = family("inflight_batch_size", "Items per executed batch (before padding)", mf.HISTOGRAM).Metric(
            labels=labels, buckets=[float(1 << k) for k in range(12)]
        )
        counters = {
            "batches": ("inflight_batches_total", "Batches launched"),
            "items": ("inflight_items_total", "Items launched (without padding)"),
            "padded_items": ("inflight_padded_items_total", "Items launched including bucket padding"),
            "launches": ("inflight_launches_total", "Engine launches (one or more per sequence bucket of a batch)"),
            "real_tokens": ("inflight_real_tokens_total", "Items x their own sequence lengths"),
            "padded_tokens": (
                "inflight_padded_tokens_total",
                "Tokens computed: bucket rows x bucket lengths, or an unpadded launch's token bucket",
            ),
            "unpadded_launches": ("inflight_unpadded_launches_total", "Launches run with masked tokens left out"),
            "mixed_length_batches": (
                "inflight_mixed_length_batches_total",
                "Batches whose requests fell in more than one sequence bucket",
            ),
            "graph_replays": ("inflight_graph_replays_total", "Launches replayed from a CUDA graph"),
            "eager_launches": ("inflight_eager_launches_total", "Launches run without a CUDA graph"),
            "slot_waits": ("inflight_slot_waits_total", "Times execute() found every slot busy"),
            "slot_wait_s": ("inflight_slot_wait_seconds_total", "Time execute() waited for a free slot"),
            "send_s": ("inflight_send_seconds_total", "Time spent in response send() calls (all threads)"),
            "send_waits": (
                "inflight_response_backlog_waits_total",
                "Times a completed batch waited because response_backlog batches awaited their responses",
            ),
            "send_wait_s": ("inflight_response_backlog_wait_seconds_total", "Time spent in those waits"),
            "respond_latency_s": (
                "inflight_respond_seconds_total",
                "Summed time from a batch's outputs on the host to its last response sent",
            ),
            "device_wait_s": ("inflight_device_wait_seconds_total", "Time the completion side waited for the device"),
            "error_responses": ("inflight_error_responses_total", "Error responses sent"),
            "failed_batches": ("inflight_failed_batches_total", "Batches that failed on the device"),
            "chunks": ("inflight_chunks_total", "Chunks launched (overlap and auto modes)"),
            "deferred_requests": (
                "inflight_deferred_requests_total",
                "Requests of deferred chunks, answered through send() (auto mode)",
            ),
            "auto_inline": (
                "inflight_auto_inline_batches_total",
                "auto: batches returned whole (the wait for the last chunk cost less than sending it)",
            ),
            "auto_deferred": (
                "inflight_auto_deferred_batches_total",
                "auto: batches whose last chunk was deferred (the wait cost more than sending it)",
            ),
            "auto_explored": (
                "inflight_auto_explored_batches_total",
                "auto: batches that took the other branch (cut or whole, defer or not) to refresh its estimate",
            ),
            "auto_idle": (
                "inflight_auto_idle_batches_total",
                "auto: batches answered in-band because the instance was not busy between its execute() calls",
            ),
            "auto_whole": (
                "inflight_auto_whole_batches_total",
                "auto: batches run as one chunk (cheaper per item than cutting them as measured; explorations apart)",
            ),
            "auto_split": (
                "inflight_auto_split_batches_total",
                "auto: batches cut into chunks (cheaper per item than one chunk as measured; explorations apart)",
            ),
        }
        self.m_counters = {
            attr: family(name, desc, mf.COUNTER).Metric(labels=labels) for attr, (name, desc) in counters.items()
        }
        gauges = {
            "auto_wait_est_us": ("inflight_auto_wait_estimate_us", "auto: estimated wait for a batch's last chunk"),
            "auto_send_est_us": ("inflight_auto_send_estimate_us", "auto: estimated cost of one send() per request"),
            "auto_whole_est_us": ("inflight_auto_whole_estimate_us", "auto: execute time per item, batches run whole"),
            "auto_split_est_us": ("inflight_auto_split_estimate_us", "auto: execute time per item, batches cut"),
            "auto_busy_share": (
                "inflight_auto_busy_share",
                "auto: the execute thread's CPU share between execute() calls (moving average)",
            ),
        }
        self.m_gauges = {
            attr: family(name, desc, mf.GAUGE).Metric(labels=labels) for attr, (name, desc) in gauges.items()
        }
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
                    "GPU temporal activity (union of kernel+copy time / wall), CUPTI window",
                    mf.GAUGE,
                ).Metric(labels=labels),
                "sync_share": family(
                    "inflight_sync_share", "Share of CUDA API time in *Synchronize calls, CUPTI window", mf.GAUGE
                ).Metric(labels=labels),
            }

    def publish(self, force: bool = False) -> None:
        """Push the change since the last call (execute thread only)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        s = self.stats
        for attr, metric in self.m_counters.items():
            value = float(getattr(s, attr))
            delta = value - self._seen.get(attr, 0.0)
            if delta > 0:
                metric.increment(delta)
                self._seen[attr] = value
        for depth, n in enumerate(s.depth_launches):
            for _ in range(min(n - self._depth_seen[depth], 1000)):
                self.m_depth.observe(float(depth))
            self._depth_seen[depth] = n
        sizes = s.batch_sizes
        for _ in range(min(len(sizes), 1000)):
            self.m_batch.observe(float(sizes.popleft()))
        sizes.clear()
        for reason, n in (self.rejected or {}).items():
            delta = n - self._rejected_seen.get(reason, 0)
            if delta > 0:
                if reason not in self.m_rejected:
                    self.m_rejected[reason] = self.f_rejected.Metric(labels={**self._labels, "reason": reason})
                self.m_rejected[reason].increment(float(delta))
                self._rejected_seen[reason] = n
        for attr, metric in self.m_gauges.items():
            metric.set(float(getattr(s, attr)))
        self.m_inflight.set(float(self.in_flight()))
        if self.gpu_figures is not None:
            figures = self.gpu_figures()
            if figures:
                for key, metric in self.m_gpu.items():
                    if key in figures:
                        metric.set(float(figures[key]))

    def close(self) -> None:
        """Drop the metric families (they are removed from the endpoint)."""
        self._families.clear()
