"""Chrome/Perfetto trace JSON from synthetic records."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from inflight.profiling import activity as act
from inflight.profiling.activity import ApiCalls, GpuOps, Ranges, Records
from inflight.profiling.trace import GPU_PID_BASE, to_trace, trace_events, write_trace

PID, EXEC_TID, DONE_TID = 4000, 4001, 4002
T0 = 1_000_000_000


def records() -> Records:
    gpu = GpuOps.from_columns(
        kind=[act.MEMCPY, act.KERNEL, act.MEMCPY, act.KERNEL, act.GRAPH],
        start=[T0 + 1_000, T0 + 2_000, T0 + 5_500, T0 + 3_000, T0 + 9_000],
        end=[T0 + 1_500, T0 + 5_000, T0 + 6_000, T0 + 4_000, T0 + 9_900],
        device=[0, 0, 0, 1, 0],
        stream=[7, 7, 8, 3, 7],
        correlation=[10, 11, 12, 13, 14],
        process=[PID] * 5,
        bytes=[4096, 0, 512, 0, 0],
        copy_kind=[act.HTOD, 0, act.DTOH, 0, 0],
        name=["", "gemm_kernel", "", "relu", ""],
    )
    api = ApiCalls.from_columns(
        start=[T0 + 500, T0 + 1_600, T0 + 2_100, T0 + 8_000],
        end=[T0 + 900, T0 + 1_900, T0 + 6_100, T0 + 8_900],
        name=[
            "cudaMemcpyAsync_v3020",
            "cudaLaunchKernel_v7000",
            "cudaStreamSynchronize_v3020",
            "cudaGraphLaunch_v10000",
        ],
        thread=[EXEC_TID, EXEC_TID, DONE_TID, EXEC_TID],
        process=[PID] * 4,
        correlation=[10, 11, 0, 14],
    )
    markers = Ranges.from_columns(
        start=[T0 + 400, T0 + 7_000],
        end=[T0 + 2_000, T0 + 7_000],
        name=["execute", "tick"],
        process=[PID, PID],
        thread=[EXEC_TID, EXEC_TID],
    )
    return Records(
        gpu=gpu,
        api=api,
        markers=markers,
        window=(T0, T0 + 10_000),
        thread_names={EXEC_TID: "execute-thread", DONE_TID: "inflight-complete"},
        notes=["synthetic"],
    )


def by(events: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [e for e in events if all(e.get(k) == v for k, v in match.items())]


def test_metadata_names_gpus_streams_processes_and_threads():
    ev = trace_events(records())
    meta = by(ev, ph="M")
    names = {(e["name"], e["pid"], e["tid"]): e["args"] for e in meta}
    assert names[("process_name", GPU_PID_BASE, 0)] == {"name": "GPU 0"}
    assert names[("process_name", GPU_PID_BASE + 1, 0)] == {"name": "GPU 1"}
    assert names[("thread_name", GPU_PID_BASE, 7)] == {"name": "stream 7"}
    assert names[("thread_name", GPU_PID_BASE, 8)] == {"name": "stream 8"}
    assert names[("thread_name", GPU_PID_BASE + 1, 3)] == {"name": "stream 3"}
    assert names[("process_name", PID, 0)] == {"name": f"host process {PID}"}
    assert names[("thread_name", PID, EXEC_TID)] == {"name": f"execute-thread ({EXEC_TID})"}
    assert names[("thread_name", PID, DONE_TID)] == {"name": f"inflight-complete ({DONE_TID})"}
    assert ev[: len(meta)] == meta  # metadata first


def test_gpu_work_becomes_complete_events_in_microseconds():
    ev = trace_events(records())
    k = by(ev, ph="X", name="gemm_kernel")[0]
    assert (k["cat"], k["pid"], k["tid"]) == ("kernel", GPU_PID_BASE, 7)
    assert k["ts"] == pytest.approx(2.0) and k["dur"] == pytest.approx(3.0)  # µs relative to the window start
    h2d = by(ev, ph="X", cat="memcpy", tid=7)[0]
    assert h2d["name"] == "memcpy HtoD 4,096 B" and h2d["args"]["bytes"] == 4096 and h2d["dur"] == pytest.approx(0.5)
    d2h = by(ev, ph="X", cat="memcpy", tid=8)[0]
    assert d2h["name"] == "memcpy DtoH 512 B"
    g = by(ev, ph="X", cat="graph")[0]
    assert g["ts"] == pytest.approx(9.0) and g["dur"] == pytest.approx(0.9)
    assert by(ev, ph="X", name="relu")[0]["pid"] == GPU_PID_BASE + 1


def test_api_calls_are_categorised_on_their_threads():
    ev = trace_events(records())
    sync = by(ev, ph="X", name="cudaStreamSynchronize")[0]
    assert (sync["cat"], sync["pid"], sync["tid"]) == ("sync", PID, DONE_TID)
    assert sync["ts"] == pytest.approx(2.1) and sync["dur"] == pytest.approx(4.0)
    assert by(ev, ph="X", name="cudaLaunchKernel")[0]["cat"] == "launch"
    assert by(ev, ph="X", name="cudaGraphLaunch")[0]["cat"] == "launch"
    assert by(ev, ph="X", name="cudaMemcpyAsync")[0]["cat"] == "memcpy_api"
    # the execute thread made no sync call: nothing in category "sync" on it
    assert not by(ev, ph="X", cat="sync", tid=EXEC_TID)


def test_flow_arrows_join_launches_to_their_gpu_work():
    ev = trace_events(records())
    starts, finishes = by(ev, ph="s"), by(ev, ph="f")
    assert {e["id"] for e in starts} == {f"{PID}:11", f"{PID}:14"} == {e["id"] for e in finishes}
    f11 = by(finishes, id=f"{PID}:11")[0]
    assert (f11["pid"], f11["tid"], f11["ts"], f11["bp"]) == (GPU_PID_BASE, 7, pytest.approx(2.0), "e")
    assert by(starts, id=f"{PID}:11")[0]["tid"] == EXEC_TID
    assert not by(trace_events(records(), flows=False), ph="s")


def test_nvtx_ranges_and_marks():
    ev = trace_events(records())
    r = by(ev, cat="nvtx", name="execute")[0]
    assert (r["ph"], r["tid"], r["ts"], r["dur"]) == ("X", EXEC_TID, pytest.approx(0.4), pytest.approx(1.6))
    m = by(ev, cat="nvtx", name="tick")[0]
    assert m["ph"] == "i" and m["s"] == "t"


def test_events_are_time_ordered_after_the_metadata():
    ev = [e for e in trace_events(records()) if e["ph"] != "M"]
    ts = [e["ts"] for e in ev]
    assert ts == sorted(ts) and min(ts) >= 0


def test_document_and_files(tmp_path: Path):
    doc = to_trace(records())
    assert doc["displayTimeUnit"] == "ns"
    assert doc["otherData"]["t0_ns"] == T0 and doc["otherData"]["window_ns"] == [T0, T0 + 10_000]
    assert doc["otherData"]["notes"] == ["synthetic"]
    p = write_trace(records(), tmp_path / "t" / "trace.json")
    assert json.loads(p.read_text())["traceEvents"] == json.loads(json.dumps(doc["traceEvents"]))
    pz = write_trace(records(), tmp_path / "trace.json.gz")
    with gzip.open(pz, "rt") as f:
        assert len(json.load(f)["traceEvents"]) == len(doc["traceEvents"])


def test_empty_records_give_an_empty_trace():
    doc = to_trace(Records())
    assert doc["traceEvents"] == [] and doc["otherData"]["t0_ns"] == 0


def test_explicit_origin():
    ev = trace_events(records(), t0=T0 + 2_000)
    assert by(ev, ph="X", name="gemm_kernel")[0]["ts"] == 0.0
