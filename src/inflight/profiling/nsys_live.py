"""The live metrics scraped beside an nsys capture (``live_metrics.jsonl``), summarised.

``scripts/nsys_profile.sh --metrics-url`` scrapes Triton's metrics page during the capture;
:func:`read_live_metrics` turns those scrapes into the gauges and counters that
:mod:`~inflight.profiling.nsys_summary` shows beside the export's own figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

#: Written beside the export by ``nsys_profile.sh --metrics-url``: one metrics scrape per line.
LIVE_METRICS_FILE = "live_metrics.jsonl"


def read_live_metrics(path: str | Path) -> dict[str, Any] | None:
    """Live metrics scraped during an nsys capture: the backend's and Triton's own.

    Each line of the file is ``{"unix", "since_start_s", "text", "error"}`` (``text``: Triton's
    Prometheus page). The CUPTI gauges are rolling windows, so samples taken every window length
    inside the capture tile it; their mean describes the same seconds as the nsys summary. The
    backend's CUPTI gauges cannot run under nsys (CUPTI allows one subscriber per process: it
    answers ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED), but Triton's ``nv_gpu_utilization`` (NVML,
    the share of each sample period in which a kernel ran) and the backend's counters can.

    Args:
        path: ``live_metrics.jsonl``.

    Returns:
        None when the file does not exist, else ``{"samples", "failed_scrapes", "gpu_activity",
        "sync_share", "triton_gpu_utilization", "in_flight"}`` (each ``{"mean", "min", "max", "n"}``
        or ``"not available"``; the GPU utilization is the mean over the GPUs the server sees) and,
        from the first and last scrape, ``"batches"``, ``"mean_batch_items"`` and ``"slot_waits"``
        (None when absent).
    """
    from inflight.loadtest.prometheus import metric_values
    from inflight.loadtest.stats import GPU_GAUGES, summarize_gauge

    p = Path(path)
    if not p.is_file():
        return None
    samples = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    texts = [x.get("text") or "" for x in samples]
    out: dict[str, Any] = {"samples": len(samples), "failed_scrapes": sum(1 for x in samples if x.get("error"))}
    gauges = {**GPU_GAUGES, "triton_gpu_utilization": "nv_gpu_utilization", "in_flight": "inflight_in_flight"}
    for key, metric in gauges.items():
        per_sample: list[float | None] = []
        for text in texts:
            values = metric_values(text, metric, None)
            if key == "in_flight":  # batches in flight in the whole model: sum over instances
                per_sample.append(float(np.sum(values)) if values else None)
            else:
                per_sample.append(float(np.mean(values)) if values else None)
        out[key] = summarize_gauge(per_sample)

    def delta(metric: str) -> float | None:
        scraped = [sum(v) for v in (metric_values(t, metric, None) for t in texts if t) if v]
        return scraped[-1] - scraped[0] if len(scraped) >= 2 else None

    # the counters (exact); the batch-size histogram holds a sample of the batches since 2026-11-26, so only
    # scrapes from before the counters existed fall back to it
    batches, items = delta("inflight_batches_total"), delta("inflight_items_total")
    if batches is None or items is None:
        items, batches = delta("inflight_batch_size_sum"), delta("inflight_batch_size_count")
    out["batches"] = batches
    out["mean_batch_items"] = items / batches if items is not None and batches else None
    out["slot_waits"] = delta("inflight_slot_waits_total")
    return out
