"""Each GPU's utilization as the A/B runner samples it: nvidia-smi's CSV lines read into fractions per GPU."""

from __future__ import annotations

import datetime as dt
import shutil

import pytest

from inflight.loadtest import gpu_util

#: What ``nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader,nounits --loop-ms=200`` prints
#: (two GPUs), with a cut-off last line and a GPU the driver could not read.
LINES = """2026/11/28 05:00:00.100, 0, 20
2026/11/28 05:00:00.100, 1, 90
2026/11/28 05:00:00.300, 0, 100
2026/11/28 05:00:00.300, 1, [N/A]
2026/11/28 05:00:00.500, 0, 80
2026/11/28 05:00:00.500, 1, 70
2026/11/28 05:00:00.7"""


def test_the_lines_become_each_gpus_fractions_after_the_warm_up() -> None:
    assert gpu_util.parse(LINES) == {"0": [0.2, 1.0, 0.8], "1": [0.9, 0.7]}
    since = dt.datetime(2026, 11, 28, 5, 0, 0, 300000).timestamp()
    assert gpu_util.parse(LINES, since=since) == {"0": [1.0, 0.8], "1": [0.7]}
    until = dt.datetime(2026, 11, 28, 5, 0, 0, 500000).timestamp()  # the window's end: the stop after it is idle
    assert gpu_util.parse(LINES, since=since, until=until) == {"0": [1.0]}
    figures = gpu_util.summarize(gpu_util.parse(LINES))
    assert list(figures) == ["0", "1"]
    assert figures["0"] == {"mean": pytest.approx(2.0 / 3), "min": 0.2, "max": 1.0, "n": 3}


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has nvidia-smi (tests/gpu samples it)")
def test_without_nvidia_smi_nothing_is_sampled_and_nothing_is_made_up() -> None:
    with gpu_util.UtilizationSampler() as sampler:
        pass
    assert sampler.result() is None


def test_an_error_from_nvidia_smi_is_said_not_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    sampler = gpu_util.UtilizationSampler()
    sampler._text = "Failed to initialize NVML: Driver/library version mismatch\n"  # what it prints then
    with caplog.at_level("WARNING"):
        assert sampler.result() is None
    assert "Driver/library version mismatch" in caplog.text
