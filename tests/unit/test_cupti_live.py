"""CUPTI live metrics without CUPTI: record reduction, rolling window, the hub with a fake cupti module."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inflight.profiling import activity as act
from inflight.profiling import cupti_hub, cupti_records
from inflight.profiling import cupti_live as cl
from inflight.profiling.cupti_live import CuptiWindow, LiveGpuMetrics, RollingWindow
from inflight.profiling.cupti_records import (
    K_CONCURRENT_KERNEL,
    K_DRIVER,
    K_GRAPH_TRACE,
    K_MARKER,
    K_MEMCPY,
    K_MEMSET,
    K_RUNTIME,
    Batch,
    CbidNames,
    pair_markers,
    reduce_activities,
)
from inflight.profiling.figures import dispatch_durations
from inflight.tool_errors import CuptiUnavailableError

PID = 777


# -- fake CUPTI records (the attribute names of cupti-python 13.4's Activity* classes) -----------------


def kernel(start: int, end: int, *, stream: int = 7, corr: int = 1, device: int = 0, name: str = "k") -> Any:
    return SimpleNamespace(
        kind=K_CONCURRENT_KERNEL,
        start=start,
        end=end,
        device_id=device,
        stream_id=stream,
        correlation_id=corr,
        name=name,
    )


def memcpy(start: int, end: int, *, nbytes: int = 64, copy_kind: int = 1, corr: int = 2) -> Any:
    return SimpleNamespace(
        kind=K_MEMCPY,
        start=start,
        end=end,
        device_id=0,
        stream_id=7,
        correlation_id=corr,
        bytes=nbytes,
        copy_kind=copy_kind,
        name="ignored",
    )


def memset(start: int, end: int) -> Any:
    return SimpleNamespace(kind=K_MEMSET, start=start, end=end, device_id=0, stream_id=7, correlation_id=3, bytes=8)


def graph(start: int, end: int, corr: int = 9) -> Any:
    return SimpleNamespace(kind=K_GRAPH_TRACE, start=start, end=end, device_id=0, stream_id=7, correlation_id=corr)


def api(start: int, end: int, cbid: int, *, tid: int = 11, driver: bool = False, corr: int = 0) -> Any:
    return SimpleNamespace(
        kind=K_DRIVER if driver else K_RUNTIME,
        start=start,
        end=end,
        cbid=cbid,
        process_id=PID,
        thread_id=tid,
        correlation_id=corr,
    )


def marker(mid: int, flags: int, ts: int, name: str = "", tid: int = 11) -> Any:
    return SimpleNamespace(
        kind=K_MARKER,
        id=mid,
        flags_=flags,
        timestamp=ts,
        name=name,
        domain="",
        object_id=SimpleNamespace(pt=SimpleNamespace(process_id=PID, thread_id=tid)),
    )


SYNC, LAUNCH, OTHER = 131, 211, 41  # cudaStreamSynchronize, cudaLaunchKernel, cudaMemcpyAsync (fallback-less)
NAMES = CbidNames(None)


def test_reduce_turns_records_into_columns():
    recs = [
        kernel(100, 200, corr=5, name="gemm"),
        memcpy(50, 60, nbytes=4096, copy_kind=1),
        memset(70, 80),
        graph(300, 400),
        api(90, 100, LAUNCH, corr=5),
        api(200, 260, 17, driver=True),  # cuCtxSynchronize
        kernel(0, 0),  # incomplete at a forced flush: zero timestamps
        kernel(500, 400),  # end before start
        SimpleNamespace(kind=99),  # a kind we do not use
    ]
    b = reduce_activities(recs, NAMES, kernel_names=True)
    assert b.dropped == 2
    assert b.gpu.kind.tolist() == [act.KERNEL, act.MEMCPY, act.MEMSET, act.GRAPH]
    assert b.gpu.start.tolist() == [100, 50, 70, 300]
    assert b.gpu.bytes.tolist() == [0, 4096, 8, 0] and b.gpu.copy_kind.tolist() == [0, 1, 0, 0]
    assert b.gpu.name.tolist() == ["gemm", "", "", ""]
    assert b.api.name.tolist() == ["cudaLaunchKernel", "cuCtxSynchronize"]
    assert b.api.domain.tolist() == [act.RUNTIME, act.DRIVER]
    assert b.api.thread.tolist() == [11, 11] and b.api.process.tolist() == [PID, PID]


def test_reduce_skips_kernel_names_unless_asked():
    b = reduce_activities([kernel(1, 2, name="long_mangled_name")], NAMES)
    assert b.gpu.name.tolist() == [""]


def test_reduce_of_an_empty_buffer():
    b = reduce_activities([], NAMES)
    assert len(b.gpu) == 0 and len(b.api) == 0 and b.markers == [] and b.dropped == 0


def test_cbid_names_fall_back_to_the_table_and_to_a_placeholder():
    assert NAMES(act.RUNTIME, 131) == "cudaStreamSynchronize"
    assert NAMES(act.RUNTIME, 239) == "cudaStreamSynchronize"  # _ptsz
    assert NAMES(act.DRIVER, 800) == "cuCtxSynchronize"  # cuCtxSynchronize_v2
    assert NAMES(act.RUNTIME, 9999) == "cuda#cbid9999"
    for (domain, cbid), name in cupti_records.FALLBACK_CBID_NAMES.items():
        assert name in act.SYNC_APIS | act.LAUNCH_APIS, (domain, cbid, name)


def test_cbid_names_prefer_cupti_and_strip_versions():
    calls = []

    class FakeCupti:
        CallbackDomain = SimpleNamespace(RUNTIME_API=2, DRIVER_API=1)

        @staticmethod
        def get_callback_name(domain: int, cbid: int) -> str:
            calls.append((domain, cbid))
            return "cudaMemcpyAsync_v3020"

    names = CbidNames(FakeCupti())
    assert names(act.RUNTIME, 41) == "cudaMemcpyAsync"
    assert names(act.RUNTIME, 41) == "cudaMemcpyAsync"
    assert calls == [(2, 41)]  # cached


def test_markers_pair_by_id():
    ev = [
        (1, cupti_records.MARKER_START, 100, "batch", PID, 11),
        (2, cupti_records.MARKER_INSTANTANEOUS, 150, "tick", PID, 11),
        (1, cupti_records.MARKER_END, 300, "", PID, 11),
        (3, cupti_records.MARKER_START, 400, "open", PID, 12),
        (4, cupti_records.MARKER_END, 500, "", PID, 12),  # end without start
    ]
    r = pair_markers(ev)
    assert list(zip(r.start.tolist(), r.end.tolist(), r.name.tolist(), strict=True)) == [
        (100, 300, "batch"),
        (150, 150, "tick"),
    ]
    r = pair_markers(ev, close_at=1000)
    assert (int(r.start[-1]), int(r.end[-1]), r.name[-1], int(r.thread[-1])) == (400, 1000, "open", 12)


def test_reduce_keeps_marker_events():
    b = reduce_activities(
        [marker(1, cupti_records.MARKER_START, 10, "x"), marker(1, cupti_records.MARKER_END, 20)], NAMES
    )
    assert b.markers == [(1, 2, 10, "x", PID, 11), (1, 4, 20, "", PID, 11)]


# -- rolling window --------------------------------------------------------------------------------


def batch(recs: list[Any]) -> Batch:
    return reduce_activities(recs, NAMES)


def test_rolling_window_figures():
    w = RollingWindow(1000)
    assert w.snapshot() is None
    w.add(batch([kernel(1100, 1300), kernel(1200, 1400, stream=8), memcpy(1600, 1700)]))  # union 300 + 100
    w.add(batch([api(1000, 1100, LAUNCH), api(1100, 1700, SYNC), api(1700, 1800, OTHER)]))
    f = w.advance(2000)
    assert f == pytest.approx({"gpu_activity": 0.4, "sync_share": 600 / 800, "kernels": 2.0, "window_s": 1e-6})
    assert w.snapshot() == f and w.snapshot() is not f


def test_rolling_window_forgets_old_work():
    w = RollingWindow(1000)
    w.add(batch([kernel(100, 900), api(100, 900, SYNC)]))
    w.add(batch([kernel(2100, 2200), api(2100, 2150, LAUNCH)]))
    f = w.advance(3000)  # window [2000, 3000)
    assert f["gpu_activity"] == pytest.approx(0.1) and f["kernels"] == 1 and f["sync_share"] == 0.0
    assert len(w._chunks) == 1


def test_rolling_window_clips_work_straddling_its_start():
    w = RollingWindow(1000)
    w.add(batch([kernel(500, 1500), api(800, 1200, SYNC), api(1200, 1400, LAUNCH)]))
    f = w.advance(2000)  # window [1000, 2000)
    assert f["gpu_activity"] == pytest.approx(0.5)
    assert f["sync_share"] == pytest.approx(200 / 400)
    assert f["kernels"] == 0  # started before the window


def test_rolling_window_starts_at_the_origin_before_a_full_window_passed():
    w = RollingWindow(1_000_000, origin_ns=900)
    w.add(batch([kernel(900, 950)]))
    f = w.advance(1000)
    assert f["window_s"] == pytest.approx(100e-9) and f["gpu_activity"] == pytest.approx(0.5)


def test_rolling_window_of_an_idle_gpu_is_zero():
    w = RollingWindow(1000)
    f = w.advance(5000)
    assert f == {"gpu_activity": 0.0, "sync_share": 0.0, "kernels": 0.0, "window_s": 1e-6}


def test_rolling_window_filters_by_device_and_counts_dropped():
    w = RollingWindow(1000, device=1)
    w.add(batch([kernel(1000, 1500, device=0), kernel(1000, 1100, device=1), kernel(0, 0)]))
    assert w.advance(2000)["gpu_activity"] == pytest.approx(0.1)
    assert w.dropped == 1


def test_rolling_window_rejects_a_non_positive_window():
    with pytest.raises(ValueError, match="positive"):
        RollingWindow(0)


def test_rolling_window_is_thread_safe():
    w = RollingWindow(10_000_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer() -> None:
        t = 0
        try:
            while not stop.is_set():
                w.add(batch([kernel(t + 1, t + 50), api(t + 1, t + 40, SYNC)]))
                t += 100
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def ticker() -> None:
        n = 0
        try:
            while not stop.is_set():
                n += 1_000
                w.advance(n)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=producer), threading.Thread(target=ticker)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        s = w.snapshot()
        assert s is None or 0.0 <= s["gpu_activity"] <= 1.0
    stop.set()
    for t in threads:
        t.join()
    assert not errors


# -- the hub with a fake cupti module --------------------------------------------------------------


class FakeCupti:
    """Just enough of cupti-python's ``cupti.cupti`` for _Hub: callbacks, kinds, flushes, a clock."""

    ActivityKind = SimpleNamespace(MEMCPY=1, KERNEL=3, RUNTIME=5, MARKER=12)
    ActivityThreadIdType = SimpleNamespace(SYSTEM=1)
    CallbackDomain = SimpleNamespace(RUNTIME_API=2, DRIVER_API=1)

    def __init__(self) -> None:
        self.enabled: set[int] = set()
        self.thread_id_type: int | None = None
        self.pending: list[Any] = []
        self.flushes: list[int] = []
        self.now = 1_000
        self.callbacks: tuple[Any, Any] | None = None
        self.refuse: set[int] = set()

    def set_thread_id_type(self, t: int) -> None:
        self.thread_id_type = t

    def activity_register_callbacks(self, requested: Any, completed: Any) -> None:
        self.callbacks = (requested, completed)

    def activity_enable(self, kind: int) -> None:
        if kind in self.refuse:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        self.enabled.add(kind)

    def activity_disable(self, kind: int) -> None:
        self.enabled.discard(kind)

    def activity_flush_all(self, flag: int) -> None:
        self.flushes.append(flag)
        assert self.callbacks is not None
        size, max_records = self.callbacks[0]()
        assert size > 0 and max_records == 0
        recs, self.pending = self.pending, []
        self.callbacks[1](recs)

    def get_timestamp(self) -> int:
        return self.now

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return {131: "cudaStreamSynchronize_v3020", 211: "cudaLaunchKernel_v7000"}.get(cbid, f"cudaOther{cbid}_v1")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeCupti, cupti_hub._Hub]:
    f = FakeCupti()
    monkeypatch.setattr(cupti_hub, "import_cupti", lambda: f)
    return f, cupti_hub._Hub()


def test_hub_setup_uses_system_thread_ids(fake: tuple[FakeCupti, cupti_hub._Hub]):
    f, hub = fake
    assert hub.timestamp() == 1_000
    assert f.thread_id_type == 1 and hub.thread_id_type == "system" and f.callbacks is not None


def test_cupti_window_over_a_fake_hub(fake: tuple[FakeCupti, cupti_hub._Hub]):
    f, hub = fake
    me = threading.get_native_id()
    f.now = 1_000
    with CuptiWindow(hub_=hub) as w:
        assert K_CONCURRENT_KERNEL in f.enabled and K_RUNTIME in f.enabled and K_GRAPH_TRACE not in f.enabled
        f.pending = [
            kernel(1_100, 1_300, name="gemm", corr=1),
            memcpy(1_400, 1_500),
            api(1_050, 1_100, 211, tid=me, corr=1),
            api(1_300, 1_500, 131, tid=me),
            api(1_500, 1_600, 131, tid=me),
            api(1_200, 1_250, 211, tid=4321, corr=2),
            kernel(0, 0),
        ]
        f.now = 2_000
    assert f.enabled == set() and f.flushes == [1, 1]
    assert w.window == (1_000, 2_000)
    assert w.gpu_activity() == pytest.approx(300 / 1000)
    assert w.sync_share() == pytest.approx(300 / 400)
    assert w.sync_calls_by_thread() == {me: 2}  # the other thread only launched
    assert w.kernels() == 1 and w.dropped == 1
    s = w.summary()
    assert s.dispatches == 1 and s.verdict.regime == "sync-bound"
    assert w.records.gpu.name.tolist() == ["gemm", ""]
    assert w.thread_names.get(me) == threading.current_thread().name


def test_cupti_window_figures_before_exit_raise(fake: tuple[FakeCupti, cupti_hub._Hub]):
    _, hub = fake
    w = CuptiWindow(hub_=hub)
    with pytest.raises(RuntimeError, match="after the with-block"):
        w.gpu_activity()


def test_cupti_window_without_driver_records_drops_them(fake: tuple[FakeCupti, cupti_hub._Hub]):
    f, hub = fake
    with CuptiWindow(hub_=hub, driver=False) as w:
        assert K_DRIVER not in f.enabled
        f.pending = [api(1_100, 1_200, 17, driver=True), api(1_100, 1_200, 131)]
        f.now = 2_000
    assert w.records.api.name.tolist() == ["cudaStreamSynchronize"]


def test_two_windows_share_kinds_with_reference_counts(fake: tuple[FakeCupti, cupti_hub._Hub]):
    f, hub = fake
    outer = CuptiWindow(hub_=hub)
    outer.__enter__()
    with CuptiWindow(hub_=hub, memcpy=False) as inner:
        f.pending = [kernel(1_100, 1_200)]
        f.now = 1_500
    assert K_CONCURRENT_KERNEL in f.enabled  # still wanted by the outer window
    f.now = 2_000
    outer.__exit__(None, None, None)
    assert f.enabled == set()
    assert len(inner.records.gpu) == 1 and len(outer.records.gpu) == 1


def test_enable_failure_is_reported_and_rolled_back(fake: tuple[FakeCupti, cupti_hub._Hub]):
    f, hub = fake
    f.refuse = {K_RUNTIME}
    with pytest.raises(CuptiUnavailableError, match="only one CUPTI subscriber"):
        CuptiWindow(hub_=hub).__enter__()
    assert f.enabled == set() and hub._enabled == {}


def test_live_metrics_over_a_fake_hub(fake: tuple[FakeCupti, cupti_hub._Hub]):
    f, hub = fake
    f.now = 1_000_000_000
    m = LiveGpuMetrics.start(0.2, flush_interval_s=0.02, hub_=hub)
    try:
        assert m.figures() is None or m.figures()["kernels"] == 0
        assert f.enabled == set(cl.LIVE_KINDS)
        t0 = f.now
        # 60 % busy over the last 0.2 s, half of the API time in syncs
        f.pending = [kernel(t0 + i * 10_000_000, t0 + i * 10_000_000 + 6_000_000) for i in range(20)]
        f.pending += [api(t0, t0 + 100_000_000, 131), api(t0 + 100_000_000, t0 + 200_000_000, 211)]
        f.now = t0 + 200_000_000
        deadline = time.monotonic() + 5
        figures = m.figures()
        while (figures is None or figures["kernels"] < 20) and time.monotonic() < deadline:
            time.sleep(0.01)
            figures = m.figures()
        assert figures is not None
        assert figures["gpu_activity"] == pytest.approx(0.6)
        assert figures["sync_share"] == pytest.approx(0.5)
        assert figures["kernels"] == 20 and figures["window_s"] == pytest.approx(0.2)
        assert set(f.flushes) == {1}  # forced flushes
    finally:
        m.stop()
    assert f.enabled == set() and hub._flusher is None
    m.stop()  # idempotent


def test_live_metrics_rejects_a_bad_window():
    with pytest.raises(ValueError, match="positive"):
        LiveGpuMetrics(0)


def test_callback_errors_do_not_escape_into_cupti(
    fake: tuple[FakeCupti, cupti_hub._Hub], caplog: pytest.LogCaptureFixture
):
    f, hub = fake

    class Broken:
        kinds = frozenset({K_CONCURRENT_KERNEL})
        periodic = False
        kernel_names = False
        interval_s = 0.0

        def on_batch(self, batch: Batch) -> None:
            raise RuntimeError("boom")

    hub.subscribe(Broken())
    f.pending = [kernel(1, 2)]
    hub.flush(force=True)  # must not raise
    assert "failed on a batch" in caplog.text


# -- without cupti-python ------------------------------------------------------------------------


def test_missing_cupti_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "cupti", None)  # makes `from cupti import cupti` raise ImportError
    with pytest.raises(CuptiUnavailableError, match="pip install cupti-python pyelftools"):
        CuptiWindow()
    with pytest.raises(CuptiUnavailableError):
        cupti_hub.import_cupti()


def test_importing_the_package_needs_no_gpu_libraries():
    code = (
        "import sys\n"
        "import inflight.profiling.cupti_live, inflight.profiling.trace, inflight.profiling.nsys_summary\n"
        "import inflight.profiling.timeline, inflight.profiling.cli, inflight.profiling.intervals\n"
        "bad = [m for m in ('cupti', 'nvtx', 'matplotlib', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dispatch_durations_group_by_correlation():
    g = act.GpuOps.from_columns(
        kind=[act.KERNEL] * 4 + [act.GRAPH],
        start=[0, 10, 50, 60, 100],
        end=[10, 20, 55, 70, 180],
        correlation=[1, 1, 0, 0, 2],
    )
    assert sorted(dispatch_durations(g, 0, 1000).tolist()) == [5, 10, 20, 80]
    assert np.array_equal(dispatch_durations(g, 500, 600), np.zeros(0, dtype=np.int64))
