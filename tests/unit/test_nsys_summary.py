"""nsys sqlite summaries from synthetic exports that use the real nsys table and column names.

Also drives ``scripts/nsys_profile.sh`` end to end against a fake ``nsys`` (a shell script that
records its arguments and writes the files the real one would), so the orchestration is tested
here; the real nsys runs on the GPU host (tests/gpu/test_profiling_gpu.py).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from inflight.profiling import activity as act
from inflight.profiling.cli import nsys_summary_main as main
from inflight.profiling.nsys_db import NsysDb, split_global_id
from inflight.profiling.nsys_summary import run, summarize_file, to_json, to_markdown
from inflight.profiling.regime import ActivitySummary
from inflight.server.config import free_port
from inflight.tool_errors import NsysExportError

pytestmark = pytest.mark.slow(seconds=70)

ROOT = Path(__file__).resolve().parents[2]
US = 1_000  # ns
BASE = 5_000_000_000  # session time of the first event
PID, TID, TID2 = 4242, 4243, 4250


def gtid(pid: int, tid: int) -> int:
    return (pid << 24) | tid


def gpid(pid: int) -> int:
    return pid << 24


class NsysBuilder:
    """Writes an sqlite file with the nsys export schema (tables only when rows are added).

    Column lists as exported by nsys 2025.3.1 on the H200 (``PRAGMA table_info``, 2026-11-21);
    TARGET_INFO_GPU is abridged. With ``--cuda-graph-trace=graph`` that export had
    CUPTI_ACTIVITY_KIND_GRAPH_TRACE (one row per execution) and no kernel table; with ``node`` it
    had kernels sharing their launch's correlationId and no GRAPH_TRACE table.
    """

    SCHEMA = {
        "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
        "CUPTI_ACTIVITY_KIND_KERNEL": (
            "start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL, contextId INT NOT NULL, "
            "greenContextId INT, streamId INT NOT NULL, correlationId INT, globalPid INT, demangledName INT NOT NULL, "
            "shortName INT NOT NULL, mangledName INT, launchType INT, cacheConfig INT, registersPerThread INT, "
            "gridX INT, gridY INT, gridZ INT, blockX INT, blockY INT, blockZ INT, staticSharedMemory INT, "
            "dynamicSharedMemory INT, localMemoryPerThread INT, localMemoryTotal INT, gridId INT, "
            "sharedMemoryExecuted INT, graphNodeId INT, sharedMemoryLimitConfig INT"
        ),
        "CUPTI_ACTIVITY_KIND_MEMCPY": (
            "start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL, contextId INT NOT NULL, greenContextId INT, "
            "streamId INT NOT NULL, correlationId INT, globalPid INT, bytes INT NOT NULL, copyKind INT NOT NULL, "
            "deprecatedSrcId INT, srcKind INT, dstKind INT, srcDeviceId INT, srcContextId INT, dstDeviceId INT, "
            "dstContextId INT, migrationCause INT, graphNodeId INT, virtualAddress INT, copyCount INT"
        ),
        "CUPTI_ACTIVITY_KIND_MEMSET": (
            "start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL, contextId INT NOT NULL, "
            "greenContextId INT, streamId INT NOT NULL, correlationId INT, globalPid INT, value INT NOT NULL, "
            "bytes INT NOT NULL, graphNodeId INT, memKind INT"
        ),
        "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": (
            "start INT NOT NULL, end INT NOT NULL, deviceId INT, contextId INT, greenContextId INT, streamId INT, "
            "correlationId INT, globalPid INT, graphId INT, graphExecId INT"
        ),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (
            "start INT NOT NULL, end INT NOT NULL, eventClass INT NOT NULL, globalTid INT, correlationId INT, "
            "nameId INT NOT NULL, returnValue INT NOT NULL, callchainId INT"
        ),
        "CUPTI_ACTIVITY_KIND_DRIVER": (
            "start INT NOT NULL, end INT NOT NULL, eventClass INT NOT NULL, globalTid INT, correlationId INT, "
            "nameId INT NOT NULL, returnValue INT NOT NULL, callchainId INT"
        ),
        "NVTX_EVENTS": (
            "start INT NOT NULL, end INT, eventType INT NOT NULL, rangeId INT, category INT, color INT, text TEXT, "
            "globalTid INT, endGlobalTid INT, textId INT, domainId INT, uint64Value INT, int64Value INT, "
            "doubleValue REAL, uint32Value INT, int32Value INT, floatValue REAL, jsonTextId INT, jsonText TEXT, "
            "binaryData BLOB"
        ),
        "OSRT_API": (
            "start INT NOT NULL, end INT NOT NULL, eventClass INT NOT NULL, globalTid INT, nameId INT NOT NULL, "
            "returnValue INT NOT NULL, nestingLevel INT, callchainId INT"
        ),
        "ENUM_CUDA_MEMCPY_OPER": "id INTEGER PRIMARY KEY, name TEXT, label TEXT",
        "TARGET_INFO_GPU": (
            "vmId INT, id INT NOT NULL, name TEXT, busLocation TEXT, isDiscrete INT, l2CacheSize INT, totalMemory INT, "
            "smCount INT, uuid TEXT, chipName TEXT, computeMajor INT, computeMinor INT"
        ),
    }
    COPY_ENUM = [
        (0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"),
        (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
        (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"),
        (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
    ]

    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, object]]] = {}
        self.strings: dict[str, int] = {}
        self.corr = 0

    def sid(self, text: str) -> int:
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
        return self.strings[text]

    def add(self, table: str, **cols: object) -> None:
        self.rows.setdefault(table, []).append(cols)

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def kernel(self, start: int, end: int, *, name: str = "gemm", stream: int = 7, device: int = 0, corr: int = 0):
        sid = self.sid(name)
        self.add(
            "CUPTI_ACTIVITY_KIND_KERNEL",
            start=start,
            end=end,
            deviceId=device,
            contextId=1,
            streamId=stream,
            correlationId=corr,
            globalPid=gpid(PID),
            demangledName=sid,
            shortName=sid,
            gridId=0,
        )

    def memcpy(self, start: int, end: int, *, nbytes: int, kind: int, stream: int = 7, corr: int = 0):
        self.add(
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            start=start,
            end=end,
            deviceId=0,
            contextId=1,
            streamId=stream,
            correlationId=corr,
            globalPid=gpid(PID),
            bytes=nbytes,
            copyKind=kind,
        )

    def graph(self, start: int, end: int, *, corr: int, stream: int = 7):
        self.add(
            "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
            start=start,
            end=end,
            deviceId=0,
            contextId=1,
            streamId=stream,
            correlationId=corr,
            globalPid=gpid(PID),
            graphId=1,
            graphExecId=2,
        )

    def api(self, start: int, end: int, name: str, *, tid: int = TID, corr: int = 0, driver: bool = False):
        table = "CUPTI_ACTIVITY_KIND_DRIVER" if driver else "CUPTI_ACTIVITY_KIND_RUNTIME"
        self.add(
            table,
            start=start,
            end=end,
            eventClass=0,
            globalTid=gtid(PID, tid),
            correlationId=corr,
            nameId=self.sid(name),
            returnValue=0,
        )

    def nvtx(self, start: int, end: int, text: str, *, via_string_id: bool = False):
        cols: dict[str, object] = dict(start=start, end=end, eventType=59, globalTid=gtid(PID, TID), domainId=0)
        if via_string_id:
            cols["textId"] = self.sid(text)
        else:
            cols["text"] = text
        self.add("NVTX_EVENTS", **cols)

    def osrt(self, start: int, end: int, name: str, *, tid: int = TID):
        self.add(
            "OSRT_API",
            start=start,
            end=end,
            eventClass=27,
            globalTid=gtid(PID, tid),
            nameId=self.sid(name),
            returnValue=0,
        )

    def write(self, path: Path, *, enums: bool = True, gpu_name: str | None = "NVIDIA H200") -> Path:
        con = sqlite3.connect(path)
        tables = set(self.rows)
        if self.strings:
            tables.add("StringIds")
        if enums and "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
            tables.add("ENUM_CUDA_MEMCPY_OPER")
        if gpu_name:
            tables.add("TARGET_INFO_GPU")
        for t in sorted(tables):
            con.execute(f"CREATE TABLE {t} ({self.SCHEMA[t]})")
        if self.strings:
            con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in self.strings.items()])
        if "ENUM_CUDA_MEMCPY_OPER" in tables:
            con.executemany("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (?, ?, ?)", self.COPY_ENUM)
        if gpu_name:
            con.execute("INSERT INTO TARGET_INFO_GPU (id, name) VALUES (0, ?)", (gpu_name,))
        for t, rows in self.rows.items():
            for r in rows:
                cols = ", ".join(f'"{c}"' for c in r)
                con.execute(f"INSERT INTO {t} ({cols}) VALUES ({', '.join('?' * len(r))})", tuple(r.values()))
        con.commit()
        con.close()
        return path


def sync_bound(n: int = 100) -> NsysBuilder:
    """Per 100 µs: H2D 5 µs, kernel 20 µs, D2H 3 µs; the host waits 35 µs in cudaStreamSynchronize."""
    b = NsysBuilder()
    for i in range(n):
        t = BASE + i * 100 * US
        c1, c2, c3 = b.next_corr(), b.next_corr(), b.next_corr()
        b.api(t - 3 * US, t - 2 * US, "cudaMemcpyAsync_v3020", corr=c1)
        b.api(t - 2 * US, t, "cudaLaunchKernel_v7000", corr=c2)
        b.api(t, t + 1 * US, "cudaMemcpyAsync_v3020", corr=c3)
        b.api(t + 3 * US, t + 38 * US, "cudaStreamSynchronize_v3020")
        b.memcpy(t, t + 5 * US, nbytes=4096, kind=1, corr=c1)
        b.kernel(t + 10 * US, t + 30 * US, corr=c2)
        b.memcpy(t + 35 * US, t + 38 * US, nbytes=512, kind=2, corr=c3)
        b.osrt(t + 40 * US, t + 90 * US, "pthread_cond_timedwait", tid=TID)  # the CUDA thread waits
        b.osrt(t + 90 * US, t + 95 * US, "ioctl", tid=TID)  # not a wait
        b.osrt(t, t + 100 * US, "poll", tid=TID2)  # a thread without CUDA calls: not counted
    return b


def gpu_bound(n: int = 20) -> NsysBuilder:
    """900 µs kernels back to back (10 µs apart); the host sits in cudaDeviceSynchronize."""
    b = NsysBuilder()
    for i in range(n):
        t = BASE + i * 910 * US
        c = b.next_corr()
        b.api(t - 5 * US, t - 3 * US, "cudaLaunchKernel_v7000", corr=c)
        b.kernel(t, t + 900 * US, corr=c, name="big_gemm")
        b.api(t - 3 * US, t + 905 * US, "cudaDeviceSynchronize_v3020")
    return b


def launch_bound(n: int = 200) -> NsysBuilder:
    """2 µs kernels, each launch call takes 20 µs; no synchronisation."""
    b = NsysBuilder()
    for i in range(n):
        t = BASE + i * 21 * US
        c = b.next_corr()
        b.api(t, t + 20 * US, "cudaLaunchKernel_v7000", corr=c)
        b.kernel(t + 20 * US, t + 22 * US, corr=c, name="tiny")
    return b


# -- figures -----------------------------------------------------------------------------------------


def test_sync_bound_figures_and_verdict(tmp_path: Path):
    path = sync_bound().write(tmp_path / "sync.sqlite")
    f = summarize_file(path)
    s = f.summary
    wall = 99 * 100 * US + 38 * US
    assert s.window_start_ns == BASE and s.window_end_ns == BASE + wall
    assert s.gpu_activity == pytest.approx(100 * 28 * US / wall)  # union of 5 + 20 + 3 µs per period
    # API time in the window: each period 1 + 2 + 1 + 35 µs; the first memcpy call and launch start
    # before the window (only 0 µs of them inside); sync share = 35 / 39 for whole periods
    assert s.sync_share == pytest.approx(3500 / (3500 + 100 * 4 - 3), rel=1e-3)
    assert s.sync_calls == 100 and s.launch_calls == 99  # the first launch starts before the window
    assert s.kernels == 100 and s.kernel_median_us == pytest.approx(20.0)
    assert s.dispatches == 100 and s.dispatch_median_us == pytest.approx(20.0)
    assert s.h2d_copies == 100 and s.h2d_avg_bytes == pytest.approx(4096)
    assert s.d2h_copies == 100 and s.d2h_avg_bytes == pytest.approx(512)
    assert s.gap_count == 3 * 100 - 1 and s.gap_median_us == pytest.approx(5.0)
    assert s.osrt_wait_share == pytest.approx(99 * 50 * US / wall)  # the last period ends before its wait
    assert s.copy_share == pytest.approx(200 / (3500 + 100 * 4 - 3), rel=1e-2)
    assert s.verdict.regime == "sync-bound"
    assert "sync share 90%" in s.verdict.reason and "short dispatches" in s.verdict.reason
    assert f.gpu_names == ["NVIDIA H200"]
    assert f.sync_calls_by_thread == {TID: 100}
    assert f.top_kernels[0]["name"] == "gemm" and f.top_kernels[0]["count"] == 100
    assert {o["name"] for o in f.osrt_top} == {"pthread_cond_timedwait", "poll", "ioctl"}


def test_waits_on_a_completion_thread_are_not_called_sync_bound(tmp_path: Path):
    """The pipelined shape: one thread launches, another waits; the GPU idles for host reasons."""

    def launches_and_waits(waiting_tid: int, path: Path) -> ActivitySummary:
        """100 periods of 100 µs: a graph launch on TID, 20 µs of GPU work, an 88 µs wait on waiting_tid."""
        b = NsysBuilder()
        for i in range(100):
            t = BASE + i * 100 * US
            c = b.next_corr()
            b.api(t, t + 2 * US, "cudaGraphLaunch_v10000", corr=c, tid=TID)
            b.kernel(t + 2 * US, t + 22 * US, corr=c)
            b.api(t + 2 * US, t + 90 * US, "cudaEventSynchronize_v3020", tid=waiting_tid)
        return summarize_file(b.write(path)).summary

    s = launches_and_waits(TID + 1, tmp_path / "p.sqlite")
    assert s.sync_share > 0.9 and s.issue_sync_share == pytest.approx(0.0)
    assert s.verdict.regime == "host-bound"
    assert "off the issue path" in s.verdict.reason

    # the same waits on the launching thread: the stock loop, sync-bound
    s = launches_and_waits(TID, tmp_path / "s.sqlite")
    assert s.issue_sync_share == pytest.approx(88 / 90, rel=1e-3)
    assert s.verdict.regime == "sync-bound"


def test_gpu_bound_verdict(tmp_path: Path):
    s = summarize_file(gpu_bound().write(tmp_path / "g.sqlite")).summary
    assert s.gpu_activity > 0.98
    assert s.verdict.regime == "GPU-bound"
    assert "the host waits for the GPU" in s.verdict.reason
    assert s.kernel_median_us == pytest.approx(900.0)


@pytest.mark.parametrize(("late", "behind"), [(0.0011, False), (0.3433, True)])
def test_the_loads_log_beside_the_export_says_whether_the_server_held_the_rate(
    tmp_path: Path, late: float, behind: bool
) -> None:
    """A generator that fell behind under the profiler (2026-11-28, H200: 34% of sends over 10 ms late) gets a note."""
    from inflight.loadtest.rategen import SUMMARY_LINE

    path = gpu_bound().write(tmp_path / "g.sqlite")
    line = SUMMARY_LINE % (5600, 178972, 5556, 0, 100 * late, 10, 68564, 184.2, 15, "")
    (tmp_path / "load.log").write_text(f"2026-11-28 23:44:52,003 INFO __main__: {line}\n")
    f = summarize_file(path)
    assert f.load is not None and f.load["offered_rps"] == 5600 and f.load["rps"] == 5556
    assert f.load["very_late_fraction"] == pytest.approx(late)
    notes = [n for n in f.notes if "fell behind" in n]
    assert bool(notes) is behind
    if behind:
        assert "34.3% of its sends" in notes[0] and "5,556 of the 5,600 req/s" in notes[0]
    md = to_markdown([f])
    assert "| load: offered / answered (req/s) | 5,600 / 5,556 |" in md
    assert ("(**behind**: saturated)" in md) is behind
    assert json.loads(to_json([f]))["files"][0]["load"]["rps"] == 5556


def test_without_a_loads_log_the_summary_has_no_load_rows(tmp_path: Path) -> None:
    f = summarize_file(gpu_bound().write(tmp_path / "g.sqlite"))
    assert f.load is None and "load:" not in to_markdown([f])


def test_launch_bound_verdict(tmp_path: Path):
    s = summarize_file(launch_bound().write(tmp_path / "l.sqlite")).summary
    assert s.launch_share > 0.99 and s.sync_share == 0.0
    assert s.gpu_activity < 0.2
    assert s.verdict.regime == "launch-bound"


def test_host_bound_when_the_gpu_idles_without_syncs_or_launches(tmp_path: Path):
    b = NsysBuilder()
    for i in range(50):
        t = BASE + i * 1000 * US
        c = b.next_corr()
        b.api(t - 1 * US, t, "cudaLaunchKernel_v7000", corr=c)
        b.api(t + 1 * US, t + 20 * US, "cudaMemcpy_v3020")
        b.kernel(t, t + 10 * US, corr=c)
    s = summarize_file(b.write(tmp_path / "h.sqlite")).summary
    assert s.verdict.regime == "host-bound"
    assert s.copy_share == pytest.approx(19 / 20, rel=1e-2) and "memcpy calls" in s.verdict.reason


def test_graph_level_trace_counts_graph_executions_as_dispatches_and_activity(tmp_path: Path):
    b = NsysBuilder()
    for i in range(10):
        t = BASE + i * 200 * US
        c = b.next_corr()
        b.api(t - 4 * US, t - 1 * US, "cudaGraphLaunch_v10000", corr=c)
        b.graph(t, t + 100 * US, corr=c)
        b.api(t - 1 * US, t + 101 * US, "cudaStreamSynchronize_v3020")
    f = summarize_file(b.write(tmp_path / "graph.sqlite"))
    s = f.summary
    assert s.kernels == 0 and s.graph_executions == 10 and s.dispatches == 10
    assert s.dispatch_median_us == pytest.approx(100.0)
    assert s.gpu_activity == pytest.approx(10 * 100 / (9 * 200 + 100))
    assert any("graph-level trace" in n for n in f.notes)


def test_node_level_graph_kernels_form_one_dispatch_per_launch(tmp_path: Path):
    b = NsysBuilder()
    for i in range(5):
        t = BASE + i * 100 * US
        c = b.next_corr()
        b.api(t - 3 * US, t - 1 * US, "cudaGraphLaunch_v10000", corr=c)
        for k in range(4):  # four graph nodes, 10 µs each, same correlation id as the launch
            b.kernel(t + k * 10 * US, t + (k + 1) * 10 * US, corr=c, name=f"node{k}")
    s = summarize_file(b.write(tmp_path / "nodes.sqlite")).summary
    assert s.kernels == 20 and s.dispatches == 5
    assert s.kernel_median_us == pytest.approx(10.0) and s.dispatch_median_us == pytest.approx(40.0)


def test_union_not_sum_for_concurrent_streams(tmp_path: Path):
    b = NsysBuilder()
    b.kernel(BASE, BASE + 100 * US, stream=7, corr=b.next_corr())
    b.kernel(BASE + 50 * US, BASE + 150 * US, stream=8, corr=b.next_corr())
    b.kernel(BASE + 250 * US, BASE + 300 * US, stream=7, corr=b.next_corr())
    s = summarize_file(b.write(tmp_path / "c.sqlite")).summary
    assert s.gpu_activity == pytest.approx(200 / 300)


def test_explicit_window_clips_work_at_its_edges(tmp_path: Path):
    path = sync_bound(10).write(tmp_path / "w.sqlite")
    lo = BASE + 20 * US  # inside the first kernel [10, 30) µs
    hi = BASE + 136 * US  # inside the second D2H copy [135, 138) µs
    s = summarize_file(path, window_start=lo, window_end=hi).summary
    # busy inside: kernel 10 µs + D2H 3 µs + H2D 5 µs + kernel 20 µs + D2H 1 µs
    assert s.gpu_activity == pytest.approx(39 / 116)
    assert s.kernels == 1  # only the kernel that *starts* in the window counts
    assert s.window_start_ns == lo and s.window_end_ns == hi


def test_nvtx_range_gives_the_window_by_text_or_string_id(tmp_path: Path):
    for via_id in (False, True):
        b = sync_bound(10)
        b.nvtx(BASE + 200 * US, BASE + 400 * US, "measure", via_string_id=via_id)
        b.nvtx(BASE, BASE + 1 * US, "other")
        f = summarize_file(b.write(tmp_path / f"n{via_id}.sqlite"), nvtx="measure")
        assert (f.summary.window_start_ns, f.summary.window_end_ns) == (BASE + 200 * US, BASE + 400 * US)
        assert f.window_source == "nvtx:measure (1 range)"
        assert f.summary.kernels == 2


def test_unknown_nvtx_range_lists_the_ones_present(tmp_path: Path):
    b = sync_bound(2)
    b.nvtx(BASE, BASE + 10 * US, "warmup")
    with pytest.raises(NsysExportError, match=r"no NVTX range named 'measure'.*warmup"):
        summarize_file(b.write(tmp_path / "n.sqlite"), nvtx="measure")


def test_missing_tables_are_tolerated_and_reported(tmp_path: Path):
    b = NsysBuilder()
    b.kernel(BASE, BASE + 10 * US)
    b.kernel(BASE + 20 * US, BASE + 30 * US)
    f = summarize_file(b.write(tmp_path / "k.sqlite", gpu_name=None))
    assert f.summary.gpu_activity == pytest.approx(20 / 30)
    assert f.summary.sync_share == 0.0 and f.summary.api_calls == 0 and f.summary.osrt_wait_share is None
    assert f.summary.h2d_avg_bytes is None and f.gpu_names == []
    assert any("CUPTI_ACTIVITY_KIND_MEMCPY" in n for n in f.notes)
    assert any("no CUDA API tables" in n for n in f.notes)


def test_no_gpu_tables_is_a_clear_error(tmp_path: Path):
    b = NsysBuilder()
    b.api(BASE, BASE + 10, "cudaFree_v3020")
    with pytest.raises(NsysExportError, match="no GPU activity"):
        summarize_file(b.write(tmp_path / "x.sqlite"))


def test_missing_or_invalid_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(NsysExportError, match=r"no such file.*nsys export --type sqlite"):
        summarize_file(tmp_path / "nope.sqlite")
    bad = tmp_path / "bad.sqlite"
    bad.write_text("this is not a database " * 100)
    with pytest.raises(NsysExportError, match="not an sqlite database"):
        summarize_file(bad)


def test_copy_kinds_follow_the_enum_table_when_ids_differ(tmp_path: Path):
    b = NsysBuilder()
    b.COPY_ENUM = [(11, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"), (12, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host")]
    b.memcpy(BASE, BASE + 10, nbytes=100, kind=11)
    b.memcpy(BASE + 20, BASE + 30, nbytes=300, kind=11)
    b.memcpy(BASE + 40, BASE + 50, nbytes=7, kind=12)
    s = summarize_file(b.write(tmp_path / "e.sqlite")).summary
    assert (s.h2d_copies, s.h2d_avg_bytes, s.d2h_copies) == (2, 200.0, 1)


def test_driver_calls_inside_runtime_calls_are_not_counted_twice(tmp_path: Path):
    b = NsysBuilder()
    b.kernel(BASE, BASE + 1000 * US)
    b.api(BASE, BASE + 100 * US, "cudaStreamSynchronize_v3020")
    b.api(BASE + 10 * US, BASE + 90 * US, "cuStreamSynchronize", driver=True)  # inside: the runtime's own call
    b.api(BASE + 200 * US, BASE + 300 * US, "cuCtxSynchronize_v2", driver=True)  # the app's own driver call
    b.api(BASE + 400 * US, BASE + 600 * US, "cudaMemcpy_v3020")
    s = summarize_file(b.write(tmp_path / "d.sqlite")).summary
    assert s.api_time_s == pytest.approx(400e-6)
    assert s.sync_share == pytest.approx(200 / 400)


def test_split_global_id():
    pid, tid = split_global_id(gtid(PID, TID))
    assert (int(pid), int(tid)) == (PID, TID)


@pytest.mark.parametrize(
    ("raw", "base"),
    [
        ("cudaStreamSynchronize_v3020", "cudaStreamSynchronize"),
        ("cudaStreamSynchronize_ptsz_v7000", "cudaStreamSynchronize"),
        ("cudaLaunchKernel_v7000", "cudaLaunchKernel"),
        ("cudaGraphLaunch_v10000", "cudaGraphLaunch"),
        ("cudaLaunchHostFunc_v2_v13020", "cudaLaunchHostFunc"),
        ("cuCtxSynchronize_v2", "cuCtxSynchronize"),
        ("cuStreamSynchronize", "cuStreamSynchronize"),
        ("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync"),
    ],
)
def test_api_names_lose_their_version_suffixes(raw: str, base: str):
    assert act.api_base_name(raw) == base


# -- output ------------------------------------------------------------------------------------------


def test_side_by_side_markdown_json_and_timelines(tmp_path: Path):
    a = sync_bound().write(tmp_path / "sync.sqlite")
    b = gpu_bound().write(tmp_path / "gpu.sqlite")
    out = tmp_path / "out"
    files = run([a, b], out=out, labels=["sync mode", "busy"], timeline_ms=2.0)
    md = (out / "summary.md").read_text()
    assert "| figure | sync mode | busy |" in md
    assert "| **regime** | **sync-bound** | **GPU-bound** |" in md
    doc = json.loads((out / "summary.json").read_text())
    assert [f["label"] for f in doc["files"]] == ["sync mode", "busy"]
    assert doc["files"][0]["summary"]["verdict"]["regime"] == "sync-bound"
    assert doc["files"][0]["summary"]["thresholds"]["sync_high"] == 0.5
    for f in files:
        assert f.timeline is not None and f.timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "sync_mode.timeline.png").is_file()


def test_timeline_rows_show_streams_and_threads():
    from inflight.profiling.timeline import slice_at, timeline_rows

    rec = act.Records(
        gpu=act.GpuOps.from_columns(
            kind=[act.KERNEL, act.MEMCPY], start=[0, 50], end=[40, 60], stream=[7, 8], copy_kind=[0, 1]
        ),
        api=act.ApiCalls.from_columns(
            start=[0, 45], end=[10, 70], name=["cudaLaunchKernel", "cudaStreamSynchronize"], thread=[1, 1]
        ),
        thread_names={1: "execute"},
    )
    rows = timeline_rows(rec, 0, 100)
    labels = [r[0] for r in rows]
    assert labels == ["GPU 0 stream 7", "GPU 0 stream 8", "thread 1 (execute)"]
    assert rows[1][1] == {"HtoD": [(50e-6, 10e-6)]}
    assert set(rows[2][1]) == {"launch call", "sync call"}
    assert slice_at(0, 100_000_000, 5.0) == (47_500_000, 52_500_000)
    assert slice_at(0, 1_000, 5.0) == (0, 1_000)
    assert slice_at(0, 100_000_000, 5.0, at=99_000_000) == (95_000_000, 100_000_000)


def test_module_main_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = sync_bound(5).write(tmp_path / "m.sqlite")
    assert main([str(path), "--json", "--timeline-ms", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["files"][0]["summary"]["kernels"] == 5
    assert main([str(tmp_path / "missing.sqlite")]) == 2


def test_script_wrapper_runs(tmp_path: Path):
    path = sync_bound(5).write(tmp_path / "s.sqlite")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "nsys_summary.py"), str(path), "--timeline-ms", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "sync-bound" in proc.stdout


def test_typer_command_via_register(tmp_path: Path):
    from inflight.profiling.cli import register

    app = typer.Typer()
    register(app)
    path = sync_bound(5).write(tmp_path / "t.sqlite")
    res = CliRunner().invoke(app, ["nsys-summary", str(path), "--out", str(tmp_path / "o"), "--label", "A"])
    assert res.exit_code == 0, res.output
    assert "| figure | A |" in res.output and (tmp_path / "o" / "summary.json").is_file()
    res = CliRunner().invoke(app, ["nsys-summary", str(tmp_path / "none.sqlite")])
    assert res.exit_code == 2 and "no such file" in res.output


def test_db_reads_only_the_window(tmp_path: Path):
    path = sync_bound(10).write(tmp_path / "r.sqlite")
    with NsysDb(path) as db:
        rec = db.load(BASE + 100 * US, BASE + 200 * US)
    assert len(rec.gpu) == 3 and set(rec.gpu.kind.tolist()) == {act.KERNEL, act.MEMCPY}
    assert int(rec.api.process[0]) == PID and int(rec.api.thread[0]) == TID


# -- scripts/nsys_profile.sh with a fake nsys ------------------------------------------------------

SCRIPT = ROOT / "scripts" / "nsys_profile.sh"

FAKE_NSYS = textwrap.dedent(
    r"""
    #!/usr/bin/env bash
    # A stand-in for nsys: logs its argv, runs the app, writes the files nsys would.
    echo "$*" >>"$FAKE_LOG"
    cmd=$1; shift
    opt() { local k=$1; shift; for a in "$@"; do [[ $a == --$k=* ]] && { echo "${a#--$k=}"; return; }; done; }
    app() { while [[ $# -gt 0 && $1 != bash ]]; do shift; done; exec "$@"; }
    case "$cmd" in
      --version) echo "NVIDIA Nsight Systems version 2025.3.1-fake" ;;
      profile)
        out=$(opt output "$@"); d=$(opt delay "$@"); w=$(opt duration "$@")
        ( app "$@" ) & pid=$!  # the app itself (exec), so that stopping it as nsys does stops it
        n=$(awk -v a="$d" -v b="$w" 'BEGIN{print int((a+b)*10)}')
        for ((i = 0; i < n; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null || { wait "$pid"; exit $?; }  # the app ended first, as with nsys
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
        echo rep >"$out.nsys-rep" ;;
      launch) app "$@" ;;
      start) opt output "$@" >"$FAKE_STATE" ;;
      stop) echo rep >"$(cat "$FAKE_STATE").nsys-rep" ;;
      shutdown) ;;
      export) cp "$FAKE_SQLITE" "$(opt output "$@")" ;;
      stats)
        p=$(opt output "$@")
        for r in cuda_api_sum cuda_gpu_kern_sum cuda_gpu_mem_time_sum osrt_sum nvtx_sum; do
          echo "x" >"${p}_$r.csv"
        done ;;
      *) echo "fake nsys: unknown command $cmd" >&2; exit 1 ;;
    esac
    """
).lstrip()


@pytest.fixture
def fake_nsys(tmp_path: Path) -> dict[str, str]:
    nsys = tmp_path / "bin" / "nsys"
    nsys.parent.mkdir()
    nsys.write_text(FAKE_NSYS)
    nsys.chmod(0o755)
    env = dict(os.environ)
    env.update(
        NSYS=str(nsys),
        FAKE_LOG=str(tmp_path / "nsys-argv.log"),
        FAKE_STATE=str(tmp_path / "state"),
        FAKE_SQLITE=str(sync_bound(20).write(tmp_path / "template.sqlite")),
        PYTHON=sys.executable,
    )
    return env


def test_profile_script_help_and_argument_errors(tmp_path: Path):
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and "--server CMD" in r.stdout and "--graph-trace" in r.stdout
    r = subprocess.run(["bash", str(SCRIPT), "--server", "true"], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "--out DIR is required" in r.stderr
    r = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path), "--server", "true", "--graph-trace", "all"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2 and "--graph-trace must be 'graph' or 'node'" in r.stderr


def test_profile_script_says_how_to_find_nsys(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "NSYS"}
    env["PATH"] = "/usr/bin:/bin"
    r = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path / "o"), "--server", "sleep 1"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert r.returncode == 2
    assert "Nsight Systems not found" in r.stderr and "NSYS=" in r.stderr


@pytest.mark.parametrize("mode", ["profile", "launch"])
def test_profile_script_end_to_end_with_a_fake_nsys(tmp_path: Path, fake_nsys: dict[str, str], mode: str):
    port = free_port()
    out = tmp_path / "out"
    served = tmp_path / "www"
    served.mkdir()
    argv = [
        "bash",
        str(SCRIPT),
        "--out",
        str(out),
        "--mode",
        mode,
        "--server",
        f"cd {served} && exec {sys.executable} -m http.server {port} --bind 127.0.0.1",
        "--ready-url",
        f"http://127.0.0.1:{port}/",
        "--load",
        "echo load-started; exec sleep 60",
        "--delay",
        "0.5",
        "--window",
        "0.5",
        "--startup",
        "3",
        "--graph-trace",
        "node",
        "--name",
        "run1",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, env=fake_nsys, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    for f in ("run1.nsys-rep", "run1.sqlite", "run1_cuda_api_sum.csv", "run1_nvtx_sum.csv", "summary.md", "run.json"):
        assert (out / f).is_file(), (f, r.stderr)
    assert "load-started" in (out / "load.log").read_text()
    meta = json.loads((out / "run.json").read_text())
    assert meta["mode"] == mode and meta["graph_trace"] == "node" and meta["window_s"] == 0.5
    assert "sync-bound" in (out / "summary.md").read_text()
    log = Path(fake_nsys["FAKE_LOG"]).read_text().splitlines()
    traced = next(line for line in log if line.startswith(mode))
    assert "--trace=cuda,nvtx,osrt" in traced and "--cuda-graph-trace=node" in traced
    collect = traced if mode == "profile" else next(line for line in log if line.startswith("start"))
    assert "--sample=none" in collect and "--cpuctxsw=none" in collect
    if mode == "profile":
        assert "--delay=3.5" in traced and "--duration=0.5" in traced
    assert any(line.startswith("export --type=sqlite") for line in log)
    assert any(line.startswith("stats --report cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum") for line in log)
    # the server the script started is gone with it: nothing listens on its port any more
    deadline = time.monotonic() + 10
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _listening(port), f"the profiled server still listens on port {port} after the script ended"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_profile_script_fails_when_the_server_dies(tmp_path: Path, fake_nsys: dict[str, str]):
    argv = [
        "bash",
        str(SCRIPT),
        "--out",
        str(tmp_path / "o"),
        "--server",
        "exit 3",
        "--ready-url",
        "http://127.0.0.1:9/",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, env=fake_nsys, timeout=60, check=False)
    assert r.returncode == 2 and "exited before it was ready" in r.stderr


def test_python_driver_builds_the_script_command_line(tmp_path: Path):
    from inflight.profiling.cli import nsys_profile_argv

    argv = nsys_profile_argv(out=tmp_path, server="tritonserver", load="locust", graph_trace="node", window_s=3)
    assert argv[:2] == ["bash", str(SCRIPT)]
    assert argv[argv.index("--window") + 1] == "3" and argv[argv.index("--graph-trace") + 1] == "node"


def test_trim_keeps_what_the_summary_reads_over_the_window(tmp_path: Path):
    from inflight.profiling.nsys_trim import trim

    src = sync_bound().write(tmp_path / "full.sqlite")
    kept = trim(src, tmp_path / "trim.sqlite", keep_ms=0.5, skip_ms=0.2)
    assert kept["CUPTI_ACTIVITY_KIND_KERNEL"] < 300 and kept["StringIds"] > 0
    lo, hi = BASE + 200 * US, BASE + 700 * US
    full = summarize_file(src, window_start=lo, window_end=hi).summary
    cut = summarize_file(tmp_path / "trim.sqlite", window_start=lo, window_end=hi).summary
    for field in ("gpu_activity", "sync_share", "kernels", "dispatches", "h2d_copies", "sync_calls", "gap_count"):
        assert getattr(cut, field) == pytest.approx(getattr(full, field)), field
    assert cut.verdict.regime == full.verdict.regime
    with pytest.raises(ValueError, match="no such file"):
        trim(tmp_path / "nope.sqlite", tmp_path / "x.sqlite")


def test_live_gauges_scraped_in_the_capture_window_reach_the_summary(tmp_path: Path, fake_nsys: dict[str, str]):
    """--metrics-url: the script scrapes the endpoint during the capture; the summary shows the gauges."""
    port = free_port()
    out = tmp_path / "out"
    served = tmp_path / "www"
    served.mkdir()
    (served / "metrics").write_text(
        "# TYPE inflight_gpu_activity gauge\n"
        'inflight_gpu_activity{model="m",version="1",instance="0"} 0.25\n'
        'inflight_gpu_activity{model="m",version="1",instance="1"} 0.35\n'
        'inflight_sync_share{model="m",version="1",instance="0"} 0.8\n'
        'inflight_sync_share{model="m",version="1",instance="1"} 0.9\n'
        'nv_gpu_utilization{gpu_uuid="GPU-x"} 0.5\n'
        'inflight_in_flight{model="m",instance="0"} 1\n'
        'inflight_in_flight{model="m",instance="1"} 2\n'
    )
    argv = [
        "bash", str(SCRIPT), "--out", str(out), "--mode", "launch",
        "--server", f"cd {served} && exec {sys.executable} -m http.server {port} --bind 127.0.0.1",
        "--ready-url", f"http://127.0.0.1:{port}/",
        "--delay", "0.2", "--window", "2", "--name", "live",
        "--metrics-url", f"http://127.0.0.1:{port}/metrics", "--metrics-every", "0.5",
    ]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, env=fake_nsys, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    lines = (out / "live_metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4, lines  # one scrape per 0.5 s of a 2 s window
    assert all(json.loads(x)["since_start_s"] <= 2.2 for x in lines)
    doc = json.loads((out / "summary.json").read_text())["files"][0]
    assert doc["live"]["samples"] == 4 and doc["live"]["failed_scrapes"] == 0
    assert doc["live"]["gpu_activity"]["mean"] == pytest.approx(0.30)  # mean over instances, then samples
    assert doc["live"]["sync_share"]["mean"] == pytest.approx(0.85)
    assert doc["live"]["triton_gpu_utilization"]["mean"] == pytest.approx(0.5)  # NVML's, no CUPTI needed
    assert doc["live"]["in_flight"]["mean"] == pytest.approx(3)  # summed over instances
    assert doc["live"]["batches"] is None and doc["live"]["mean_batch_items"] is None  # no batch counters on the page
    md = (out / "summary.md").read_text()
    assert "live CUPTI GPU activity, same window" in md and "30.0 %" in md and "4 samples" in md


def test_metrics_url_needs_launch_mode(tmp_path: Path, fake_nsys: dict[str, str]):
    argv = ["bash", str(SCRIPT), "--out", str(tmp_path / "o"), "--server", "true", "--metrics-url", "http://x/metrics"]
    r = subprocess.run(argv, capture_output=True, text=True, env=fake_nsys, check=False)
    assert r.returncode == 2 and "--metrics-url needs --mode launch" in r.stderr


def test_live_gauges_absent_are_reported_with_the_servers_reason(tmp_path: Path):
    path = sync_bound(20).write(tmp_path / "p.sqlite")
    (tmp_path / "live_metrics.jsonl").write_text(
        json.dumps({"unix": 1.0, "since_start_s": 1.0, "text": "nv_inference_count 3\n", "error": None})
        + "\n"
        + json.dumps({"unix": 2.0, "since_start_s": 2.0, "text": "", "error": "timed out"})
        + "\n"
    )
    (tmp_path / "server.log").write_text(
        "W1121 model.py] cupti=true but live CUPTI metrics are unavailable: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS\n"
    )
    f = summarize_file(path)
    assert f.live is not None and (f.live["samples"], f.live["failed_scrapes"]) == (2, 1)
    assert f.live["gpu_activity"] == f.live["sync_share"] == f.live["triton_gpu_utilization"] == "not available"
    assert any("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS" in n for n in f.notes)
    from inflight.profiling.nsys_summary import to_markdown

    assert "| live CUPTI sync share, same window (backend gauge) | not available |" in to_markdown([f])
    (tmp_path / "sub").mkdir()
    assert summarize_file(sync_bound(20).write(tmp_path / "sub" / "q.sqlite")).live is None  # no scrapes beside it


def test_live_counters_give_batches_and_items_per_batch_between_first_and_last_scrape(tmp_path: Path):
    from inflight.profiling.nsys_live import read_live_metrics

    def page(count: int, total: int, counters: bool) -> str:
        # the histogram holds a sample (a tenth here); the counters are exact and, where present, decide
        text = "".join(
            f'inflight_batch_size_count{{model="m",instance="{i}"}} {count // 10 if counters else count}\n'
            f'inflight_batch_size_sum{{model="m",instance="{i}"}} {total // 5 if counters else total}\n'
            for i in (0, 1)
        )
        if counters:
            text += "".join(
                f'inflight_batches_total{{model="m",instance="{i}"}} {count}\n'
                f'inflight_items_total{{model="m",instance="{i}"}} {total}\n'
                for i in (0, 1)
            )
        return text + f'inflight_slot_waits_total{{model="m",instance="0"}} {count // 10}\n'

    for counters in (True, False):  # False: a scrape from before the counters (the histogram was exact then)
        lines = [page(100, 200_000, counters), page(150, 300_000, counters), page(300, 600_000, counters)]
        f = tmp_path / "live_metrics.jsonl"
        f.write_text(
            "".join(
                json.dumps({"unix": i, "since_start_s": i, "text": t, "error": None}) + "\n"
                for i, t in enumerate(lines)
            )
        )
        live = read_live_metrics(f)
        assert live is not None
        assert live["batches"] == 400 and live["mean_batch_items"] == pytest.approx(2000)
        assert live["slot_waits"] == 20


def test_module_entry_point_is_the_inflight_command(capsys: pytest.CaptureFixture[str]) -> None:
    """``scripts/nsys_summary.py`` (``nsys_summary_main``) and ``inflight nsys-summary`` are one command line."""
    assert main(["--bogus"]) == 2
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--out", "--label", "--window-start", "--nvtx", "--timeline-ms", "--json", "--sync-high"):
        assert option in text
