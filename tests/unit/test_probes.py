"""The instance's diagnostics: the execute thread's timing, the GIL probe and NVTX ranges when off."""

from __future__ import annotations

import contextlib
import time

from inflight.runtime.probes import ExecuteTiming, GilProbe, NvtxRanges


def test_execute_timing_counts_calls_and_the_gaps_between_them() -> None:
    t = ExecuteTiming()
    assert t.enter() is None  # the first execute(): no gap before it
    time.sleep(0.02)
    t.exit()
    time.sleep(0.01)
    gap = t.enter()
    assert gap is not None and gap >= 0.01
    t.exit()
    f = t.figures
    assert f["executes"] == 2 and f["executes_over_10ms"] == 1
    assert f["execute_s"] >= 0.02 and f["execute_max_ms"] >= 20.0
    assert f["between_executes_s"] == gap
    assert t.failed() == 1 and t.failed() == 2 and f["execute_failures"] == 2
    assert list(f) == [
        "executes",
        "execute_s",
        "between_executes_s",
        "execute_max_ms",
        "executes_over_10ms",
        "execute_failures",
    ]


def test_the_gil_probe_samples_until_stopped() -> None:
    probe = GilProbe(period_s=0.001)
    time.sleep(0.05)
    got = probe.stop()
    assert got["gil_probe_samples"] >= 1
    assert got["gil_probe_max_late_us"] >= got["gil_probe_mean_late_us"]


def test_nvtx_ranges_when_off_are_no_ops() -> None:
    ranges = NvtxRanges(False, "inflight")
    with ranges.range("execute") as r:
        assert r is None
    assert isinstance(ranges.range("parse"), contextlib.nullcontext)
