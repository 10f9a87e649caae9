"""Profiling: where the time goes between the GPU, the CUDA API and the host.

Modules (none imports CUPTI, nvtx or matplotlib at import time, so the package needs no GPU):

* :mod:`~inflight.profiling.intervals` -- exact union/clip/gap arithmetic on time intervals.
* :mod:`~inflight.profiling.activity` -- columnar GPU-op / API-call records, filled by every source.
* :mod:`~inflight.profiling.figures` -- the figures computed from them (GPU temporal activity,
  sync share, dispatches, OS-runtime waits).
* :mod:`~inflight.profiling.regime` -- every figure of a window in one summary, and the regime verdict.
* :mod:`~inflight.profiling.nsys_summary` -- the same figures from Nsight Systems sqlite exports.
* :mod:`~inflight.profiling.nsys_db` -- an Nsight Systems sqlite export read into those records.
* :mod:`~inflight.profiling.nsys_live` -- the live metrics scraped beside an nsys capture.
* :mod:`~inflight.profiling.cupti_live` -- in-process collection with cupti-python
  (``LiveGpuMetrics`` for Triton's metrics endpoint, ``CuptiWindow`` for benchmarks).
* :mod:`~inflight.profiling.cupti_hub` -- the process-wide owner of CUPTI's activity state.
* :mod:`~inflight.profiling.cupti_records` -- cupti-python's activity records reduced to columns.
* :mod:`~inflight.profiling.trace` -- records as a Chrome/Perfetto trace (ui.perfetto.dev).
* :mod:`~inflight.profiling.timeline` -- an Nsight-like timeline PNG of a few milliseconds.
* :mod:`~inflight.profiling.cli` -- the typer commands (``register(app)``).
"""
