"""Profiling on a real GPU: CUPTI windows and live metrics on torch work, NVTX markers, nsys end to end.

Skips (with the reason) when torch has no CUDA device, cupti-python is missing, or nsys is not found.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from inflight.profiling import activity as act

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


@pytest.fixture(scope="module")
def cupti(torch: Any) -> Any:
    from inflight.profiling.cupti_hub import import_cupti
    from inflight.tool_errors import CuptiUnavailableError

    try:
        return import_cupti()
    except CuptiUnavailableError as e:
        pytest.skip(str(e))


def test_window_sees_kernels_copies_and_the_callers_syncs(torch: Any, cupti: Any):
    from inflight.profiling.cupti_live import CuptiWindow

    x = torch.randn(2048, 2048, device="cuda")
    host = torch.randn(1 << 20).pin_memory()
    torch.cuda.synchronize()
    with CuptiWindow() as w:
        for _ in range(20):
            y = x @ x
        dev = host.to("cuda", non_blocking=True)
        back = (y[:1] * 2).cpu()
        torch.cuda.synchronize()
    del dev, back
    assert w.thread_id_type == "system"
    assert w.kernels() >= 20
    g = w.records.gpu
    h2d = (g.kind == act.MEMCPY) & (g.copy_kind == act.HTOD)
    assert h2d.any() and int(g.bytes[h2d].max()) == (1 << 20) * 4
    assert ((g.kind == act.MEMCPY) & (g.copy_kind == act.DTOH)).any()
    assert any(str(n) for n in g.name[g.kind == act.KERNEL]), "kernel names missing"
    me = threading.get_native_id()
    assert w.sync_calls_by_thread().get(me, 0) >= 1, w.sync_calls_by_thread()
    assert 0.0 < w.gpu_activity() <= 1.0
    assert 0.0 < w.sync_share() <= 1.0
    s = w.summary()
    assert s.dispatches >= 20 and s.verdict.regime


def test_sync_calls_by_thread_tell_a_syncing_thread_from_a_launching_one(torch: Any, cupti: Any):
    from inflight.profiling.cupti_live import CuptiWindow

    a = torch.randn(1024, 1024, device="cuda")
    outs = {"sync": torch.empty_like(a), "launch": torch.empty_like(a)}
    torch.cuda.synchronize()
    ids: dict[str, int] = {}
    warm, go = threading.Barrier(3), threading.Event()

    def syncing() -> None:
        ids["sync"] = threading.get_native_id()
        torch.matmul(a, a, out=outs["sync"])  # per-thread cuBLAS setup happens before the window
        warm.wait()
        go.wait()
        for _ in range(10):
            torch.matmul(a, a, out=outs["sync"])
            torch.cuda.synchronize()

    def launching() -> None:
        ids["launch"] = threading.get_native_id()
        torch.matmul(a, a, out=outs["launch"])
        warm.wait()
        go.wait()
        for _ in range(50):
            torch.matmul(a, a, out=outs["launch"])

    threads = [threading.Thread(target=syncing, name="syncer"), threading.Thread(target=launching, name="launcher")]
    for t in threads:
        t.start()
    warm.wait()
    torch.cuda.synchronize()
    with CuptiWindow() as w:
        go.set()
        for t in threads:
            t.join()
        torch.cuda.synchronize()
    counts = w.sync_calls_by_thread()
    assert counts.get(ids["sync"], 0) >= 10, counts
    assert ids["launch"] not in counts, counts
    assert counts.get(threading.get_native_id(), 0) >= 1
    assert w.thread_names.get(ids["launch"]) == "launcher" or ids["launch"] not in w.thread_names
    launches = w.records.api.is_in(act.LAUNCH_APIS) & (w.records.api.thread == ids["launch"])
    assert int(launches.sum()) >= 50


def test_gpu_activity_of_a_sync_loop_is_below_a_queued_loop(torch: Any, cupti: Any):
    from inflight.profiling.cupti_live import CuptiWindow

    x = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    with CuptiWindow() as sync_w:
        for _ in range(300):
            x = torch.tanh(x @ x * 1e-3)
            torch.cuda.synchronize()
    with CuptiWindow() as queued_w:
        for _ in range(300):
            x = torch.tanh(x @ x * 1e-3)
        torch.cuda.synchronize()
    a_sync, a_queued = sync_w.gpu_activity(), queued_w.gpu_activity()
    assert a_queued > a_sync, (a_sync, a_queued)
    assert sync_w.sync_share() > queued_w.sync_share()


def test_live_metrics_follow_a_busy_then_idle_gpu(torch: Any, cupti: Any):
    from inflight.profiling.cupti_live import LiveGpuMetrics

    x = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    stop = threading.Event()

    def work() -> None:  # stands in for Triton's execute thread keeping the GPU busy
        while not stop.is_set():
            for _ in range(8):
                _ = x @ x
            torch.cuda.synchronize()

    m = LiveGpuMetrics.start(window_s=0.5)
    t = threading.Thread(target=work)
    try:
        t.start()
        time.sleep(1.5)
        busy = m.figures()  # read while the GPU works: the last 0.5 s are all busy
        stop.set()
        t.join()
        assert busy is not None, "no figures after 1.5 s"
        assert busy["gpu_activity"] > 0.8 and busy["kernels"] > 0, busy
        assert busy["sync_share"] > 0.5 and busy["window_s"] == pytest.approx(0.5, rel=0.1), busy
        time.sleep(1.2)
        idle = m.figures()
        assert idle is not None and idle["gpu_activity"] < 0.1 and idle["kernels"] == 0, idle
    finally:
        stop.set()
        if t.is_alive():
            t.join()
        m.stop()


def test_nvidia_smi_utilization_of_a_busy_then_idle_gpu(torch: Any) -> None:
    """The A/B runner's device-level figure (inflight.loadtest.gpu_util): high while kernels run back to back."""
    from inflight.loadtest import gpu_util

    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    with gpu_util.UtilizationSampler() as busy:
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            for _ in range(50):
                x = (x @ x).clamp_(-1, 1)
            torch.cuda.synchronize()
    time.sleep(1.5)  # the driver's sample period (up to 1 s) passes
    with gpu_util.UtilizationSampler() as idle:
        time.sleep(2.0)
    b, i = busy.result(), idle.result()
    assert b is not None and i is not None, "nvidia-smi sampled nothing"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    assert b[visible]["n"] >= 5 and b[visible]["max"] >= 0.9, b
    assert i[visible]["mean"] <= 0.2, i


def test_trace_of_a_window(torch: Any, cupti: Any, tmp_path: Path):
    from inflight.profiling.cupti_live import collect
    from inflight.profiling.trace import write_trace

    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            _ = x @ x
            torch.cuda.synchronize()

    t = threading.Thread(target=work)
    t.start()
    try:
        rec = collect(0.3)
    finally:
        stop.set()
        t.join()
    doc = json.loads(write_trace(rec, tmp_path / "trace.json").read_text())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all(e["dur"] > 0 for e in kernels)
    assert any(e.get("cat") == "sync" for e in doc["traceEvents"])
    assert any(e["ph"] == "f" for e in doc["traceEvents"]), "no launch -> kernel flow"


def test_nvtx_ranges_reach_cupti_with_the_injection_library(torch: Any, cupti: Any):
    from inflight.profiling.cupti_hub import cupti_library_path

    lib = cupti_library_path()
    if lib is None:
        pytest.skip("libcupti not located by cuda.pathfinder")
    # torch.cuda.nvtx ranges reach CUPTI (seen on the H200, CUPTI 13); the `nvtx` package's
    # annotate() produced no MARKER record there although nsys sees it, so it is not asserted.
    code = textwrap.dedent(
        """
        import json, threading, torch
        from inflight.profiling.cupti_live import CuptiWindow
        x = torch.randn(512, 512, device="cuda"); torch.cuda.synchronize()
        with CuptiWindow(markers=True) as w:
            with torch.cuda.nvtx.range("inflight-range"):
                y = x @ x
            torch.cuda.nvtx.mark("inflight-mark")
            torch.cuda.synchronize()
        m = w.records.markers
        rows = [[str(n), int(e - s), int(t)] for n, s, e, t in zip(m.name, m.start, m.end, m.thread)]
        print(json.dumps({"me": threading.get_native_id(), "ranges": rows}))
        """
    )
    env = dict(os.environ, NVTX_INJECTION64_PATH=lib)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    ranges = {name: (dur, tid) for name, dur, tid in doc["ranges"]}
    assert ranges["inflight-range"][0] > 0 and ranges["inflight-range"][1] == doc["me"], doc
    assert ranges["inflight-mark"][0] == 0, doc


def _nsys() -> str:
    nsys = os.environ.get("NSYS") or shutil.which("nsys")
    if not nsys:
        pytest.skip("nsys not found: set NSYS (source .kit/setup.sh .kit)")
    return nsys


WORKLOAD = """
import time, torch, nvtx
x = torch.randn(1024, 1024, device="cuda")
h = torch.randn(1 << 18).pin_memory()
t_end = time.monotonic() + {seconds}
while time.monotonic() < t_end:
    with nvtx.annotate("batch"):
        d = h.to("cuda", non_blocking=True)
        y = x @ x
        torch.cuda.synchronize()
"""


@pytest.mark.parametrize("mode", ["profile", "launch"])
def test_nsys_profile_script_and_summary(torch: Any, tmp_path: Path, mode: str):
    nsys = _nsys()
    pytest.importorskip("nvtx")
    work = tmp_path / "work.py"
    work.write_text(WORKLOAD.format(seconds=40))
    out = tmp_path / "out"
    argv = [
        "bash",
        str(ROOT / "scripts" / "nsys_profile.sh"),
        "--out",
        str(out),
        "--mode",
        mode,
        "--server",
        f"exec {sys.executable} {work}",
        "--ready-url",
        "none",
        "--delay",
        "8",
        "--window",
        "2",
        "--startup",
        "0",
        "--graph-trace",
        "node",
    ]
    env = dict(os.environ, NSYS=nsys, PYTHON=sys.executable)
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=420, check=False)
    logs = "".join(
        (out / f).read_text(errors="replace")[-2000:] for f in ("nsys.log", "server.log") if (out / f).exists()
    )
    assert r.returncode == 0, r.stderr[-3000:] + logs
    for f in ("profile.nsys-rep", "profile.sqlite", "summary.json", "profile_cuda_api_sum.csv"):
        assert (out / f).is_file(), f
    doc = json.loads((out / "summary.json").read_text())["files"][0]
    s = doc["summary"]
    assert s["kernels"] > 0 and s["h2d_copies"] > 0 and s["sync_calls"] > 0, s
    assert 0.0 < s["gpu_activity"] <= 1.0 and s["sync_share"] > 0.0
    assert s["wall_s"] == pytest.approx(2.0, abs=1.0)
    from inflight.profiling.nsys_summary import summarize_file

    by_nvtx = summarize_file(out / "profile.sqlite", nvtx="batch", timeline_ms=0)
    assert by_nvtx.summary.kernels > 0
