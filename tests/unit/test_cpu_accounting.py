"""The A/B runner's CPU accounting (inflight.loadtest.cpu) against real processes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inflight.loadtest import cpu
from inflight.loadtest.report_tables import comparison_table, runs_table

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def _stub_named_python(tmp_path: Path) -> Path:
    """A python3 that the kernel names like Triton's stub (comm is the executable's file name)."""
    exe = tmp_path / cpu.STUB_NAME
    exe.symlink_to(Path(sys.executable).resolve())
    return exe


def test_window_counts_a_childs_cpu_in_the_server_tree_and_a_stub_by_name(tmp_path: Path) -> None:
    # a "server" (this process's child) with one child of its own named like the Python-backend stub;
    # both burn CPU time inside the window
    stub = _stub_named_python(tmp_path)
    script = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([{str(stub)!r}, '-c', {BURN.format(s=0.6)!r}])\n" + BURN.format(s=0.3) + "p.wait()\n"
    )
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)\n" + script])
    try:
        time.sleep(0.2)  # the child exists, the grandchild not yet: the snapshot must still work
        before = cpu.snapshot(server.pid)
        time.sleep(0.3)
        # both are running now; take the end snapshot while they are alive (an exited one's time is gone)
        deadline = time.monotonic() + 10
        after = cpu.snapshot(server.pid)
        while (after.stub_s or 0) < 0.55 and time.monotonic() < deadline:
            time.sleep(0.05)
            after = cpu.snapshot(server.pid)
    finally:
        server.wait(timeout=30)
    w = cpu.window(before, after, requests=1000)
    assert after.stub_s is not None and after.server_s is not None
    assert after.stub_s >= 0.55, after  # the stub-named grandchild, counted by its name
    assert after.server_s - before.server_s >= 0.55 + 0.25 - 0.05, (before, after)  # both burners
    assert w["host_cores"] == len(os.sched_getaffinity(0))
    assert 0 < w["host_busy"] <= 1
    assert w["stub_cores"] <= w["server_cores"]
    assert w["server_us_per_request"] == pytest.approx((after.server_s - before.server_s) / 1000 * 1e6)
    assert w["other_cores"] >= 0


def test_snapshot_of_a_gone_server_has_host_figures_only() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    a = cpu.snapshot(p.pid)
    assert a.server_s is None and a.stub_s is None
    assert a.host_total_s > a.host_busy_s > 0
    assert 0.0 <= a.host_steal_s <= a.host_busy_s  # steal is busy time the hypervisor took
    w = cpu.window(a, cpu.snapshot(None), requests=10)
    assert math.isnan(w["server_cores"]) and math.isnan(w["server_us_per_request"])


def test_window_arithmetic() -> None:
    before = cpu.CpuSnapshot(
        t=0.0, host_busy_s=100.0, host_total_s=400.0, server_s=10.0, stub_s=4.0, cores=16, host_steal_s=2.0
    )
    after = cpu.CpuSnapshot(
        t=10.0, host_busy_s=180.0, host_total_s=560.0, server_s=50.0, stub_s=24.0, cores=16, host_steal_s=10.0
    )
    w = cpu.window(before, after, requests=20_000)
    assert w["host_busy"] == pytest.approx(80 / 160)
    assert w["host_steal"] == pytest.approx(8 / 160)
    assert w["host_busy_cores"] == pytest.approx(8.0)
    assert w["server_cores"] == pytest.approx(4.0)
    assert w["stub_cores"] == pytest.approx(2.0)
    assert w["other_cores"] == pytest.approx(4.0)
    assert w["server_us_per_request"] == pytest.approx(40 / 20_000 * 1e6)
    assert math.isnan(cpu.window(before, after, requests=0)["server_us_per_request"])


def test_a_saturated_window_reads_all_of_the_host_not_a_tick_over() -> None:
    # two cores busy all of a 5 s window, counted in 10 ms ticks: the kernel's count can run a tick past the clock
    before = cpu.CpuSnapshot(t=0.0, host_busy_s=100.0, host_total_s=200.0, server_s=1.0, stub_s=0.5, cores=2)
    after = cpu.CpuSnapshot(t=5.0, host_busy_s=110.01, host_total_s=210.01, server_s=6.0, stub_s=3.0, cores=2)
    w = cpu.window(before, after, requests=100)
    assert w["host_busy"] == 1.0 and w["host_busy_cores"] == 2.0
    # under it, the figures are the counters' own
    after = cpu.CpuSnapshot(t=5.0, host_busy_s=105.0, host_total_s=210.0, server_s=6.0, stub_s=3.0, cores=2)
    w = cpu.window(before, after, requests=100)
    assert w["host_busy"] == pytest.approx(0.5) and w["host_busy_cores"] == pytest.approx(1.0)


def test_combine_weights_by_wall_time_and_requests() -> None:
    a = {
        "wall_s": 10.0,
        "host_cores": 16,
        "host_busy": 0.5,
        "host_busy_cores": 8.0,
        "server_cores": 4.0,
        "stub_cores": 2.0,
        "other_cores": 4.0,
        "server_us_per_request": 100.0,
    }
    b = {**a, "wall_s": 30.0, "host_busy": 0.9, "server_us_per_request": 200.0}
    c = cpu.combine([a, b], [1000, 3000])
    assert c is not None and c["windows"] == 2
    assert c["host_busy"] == pytest.approx((0.5 * 10 + 0.9 * 30) / 40)
    assert c["server_us_per_request"] == pytest.approx((100 * 1000 + 200 * 3000) / 4000)
    assert cpu.combine([{}, {}], [0, 0]) is None


def test_report_shows_the_cpu_rows() -> None:
    summary = {
        "variant": "A",
        "spec": "m_sync",
        "cpu": {
            "host_busy": 0.953,
            "server_cores": 9.87,
            "stub_cores": 3.21,
            "other_cores": 5.5,
            "server_us_per_request": 456.7,
        },
    }
    doc = {
        "summary": [summary, {**summary, "variant": "B", "spec": "m_inflight", "cpu": None}],
        "runs": [{"variant": "A", "round": 1, "valid": True, "cpu": {"host_busy": 0.953}}],
    }
    table = comparison_table(doc)
    assert "| host CPU busy (the run's cores) | 95.3% | n/a |" in table
    assert "| server CPU (µs/request) | 456.7 | n/a |" in table
    assert "| stubs' CPU (cores) | 3.21 | n/a |" in table
    assert "| 95.3% | yes |" in runs_table(doc)


def test_the_runs_cores_follow_taskset() -> None:
    # a runner started under taskset sees only its own cores (lanes side by side on one host)
    code = "from inflight.loadtest import cpu; s = cpu.snapshot(None); print(cpu.run_cores(), s.cores)"
    r = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["[0]", "1"], r.stdout


def test_busiest_threads_ranks_the_threads_of_a_window() -> None:
    before = {1: ("tritonserver/http", 10.0), 2: ("stub/python", 5.0), 3: ("tritonserver/http", 1.0)}
    after = {1: ("tritonserver/http", 11.9), 2: ("stub/python", 5.5), 3: ("tritonserver/http", 1.2), 4: ("stub/x", 0.3)}
    got = cpu.busiest_threads(before, after, wall=2.0, top=2)
    assert got["busiest"] == [["tritonserver/http", 0.95], ["stub/python", 0.25]]
    assert got["over_80"] == 1
    assert got["by_name"]["tritonserver/http"] == pytest.approx(1.05)
    assert got["by_name"]["stub/x"] == pytest.approx(0.15)  # born in the window: all its time counts
    assert got["count"] == {"tritonserver": 2, "stub": 2}
    assert cpu.busiest_threads({}, {}, wall=1.0) == {"busiest": [], "over_80": 0, "by_name": {}, "count": {}}


def test_a_spinning_thread_of_the_watched_process_shows_as_busy() -> None:
    """A process whose thread spins shows that thread as its busiest, at the share of a core it had.

    The watched process is another one, as the runner watches tritonserver: a thread of this process would
    fight the snapshot for the GIL and make it take seconds. The share is checked against the process's own
    CPU time over the same window (on a quiet host about one core; beside other tests on 2 cores, less).
    """
    import time

    import psutil

    spinner = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: pass"])
    try:
        proc = psutil.Process(spinner.pid)
        time.sleep(0.2)  # past the interpreter's start-up
        used = -sum(proc.cpu_times()[:2])
        before = cpu.snapshot(spinner.pid)
        time.sleep(0.5)
        after = cpu.snapshot(spinner.pid)
        used += sum(proc.cpu_times()[:2])
    finally:
        spinner.kill()
        spinner.wait()
    window = cpu.window(before, after, 10)
    name, share = window["threads"]["busiest"][0]
    assert name.startswith("tritonserver/")
    expected = used / window["wall_s"]
    assert expected > 0.05, "the spinner hardly ran"
    # the kernel counts in 10 ms ticks: two ticks of 0.5 s either way, and the two readings' few ms apart
    assert share == pytest.approx(expected, abs=0.1), (share, expected)


def test_gpu_memory_is_empty_without_nvidia_smi() -> None:
    assert cpu.gpu_memory(os.getpid(), smi="/nonexistent/nvidia-smi") == {}


def test_gpu_memory_sums_the_server_trees_processes_only(tmp_path: Path) -> None:
    """The query's rows are kept for the server's own processes; another process's memory is not counted."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        smi = tmp_path / "smi"
        smi.write_text(f"#!/bin/sh\necho '{os.getpid()}, 500'\necho '{child.pid}, 1200'\necho '1, 9999'\n")
        smi.chmod(0o755)
        got = cpu.gpu_memory(os.getpid(), smi=str(smi))
        assert got == {"processes": 2, "used_mib": 1700, "per_process_mib": [500, 1200]}
    finally:
        child.kill()
        child.wait()
