"""The summary against a real capture: a pipelined bert_tiny instance under Locust load on the H200.

``fixtures/nsys-bert_tiny_inflight.sqlite`` is the output of ``scripts/lab/gpu_session.sh profile``
(nsys 2025.3.1, ``-t cuda,nvtx,osrt --sample=none --cpuctxsw=none``, graph-level trace) cut to a
short window by ``inflight nsys-trim`` (``scripts/lab/gpu_session.sh fixture``). Every expected figure
below is computed here straight from the tables with SQL and a plain interval merge, not with the
code under test.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from inflight.profiling.nsys_summary import summarize_file

FIXTURE = Path(__file__).parent / "fixtures" / "nsys-bert_tiny_inflight.sqlite"


@pytest.fixture(scope="module")
def db() -> sqlite3.Connection:
    assert FIXTURE.stat().st_size < 1_000_000
    return sqlite3.connect(f"file:{FIXTURE}?mode=ro", uri=True)


def _merged_busy(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    busy, cur_s, cur_e = 0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy


def test_real_capture_figures_match_the_tables(db: sqlite3.Connection) -> None:
    f = summarize_file(FIXTURE)
    s = f.summary
    graphs = db.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchall()
    copies = db.execute("SELECT start, end, copyKind, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall()
    gpu = graphs + [(a, b) for a, b, _, _ in copies]
    lo, hi = min(a for a, _ in gpu), max(b for _, b in gpu)
    assert (s.window_start_ns, s.window_end_ns) == (lo, hi)  # the GPU span

    assert s.gpu_activity == pytest.approx(_merged_busy(gpu, lo, hi) / (hi - lo))
    assert s.dispatches == s.graph_executions == len(graphs) and s.kernels == 0
    h2d = [b for _, _, k, b in copies if k == 1]
    d2h = [b for _, _, k, b in copies if k == 2]
    assert s.h2d_copies == len(h2d) and s.h2d_avg_bytes == pytest.approx(sum(h2d) / len(h2d))
    assert s.d2h_copies == len(d2h) and s.d2h_avg_bytes == pytest.approx(sum(d2h) / len(d2h))
    assert f.gpu_names == ["NVIDIA H200"]


def test_real_capture_sync_share_and_where_the_waits_are(db: sqlite3.Connection) -> None:
    s = summarize_file(FIXTURE).summary
    names = dict(db.execute("SELECT id, value FROM StringIds").fetchall())
    rows = db.execute("SELECT start, end, nameId, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchall()
    lo, hi = s.window_start_ns, s.window_end_ns

    def clip(a: int, b: int) -> int:
        return max(0, min(b, hi) - max(a, lo))

    def is_sync(n: int) -> bool:
        return names[n].split("_v")[0] in ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")

    total = sum(clip(a, b) for a, b, _, _ in rows)
    sync = sum(clip(a, b) for a, b, n, _ in rows if is_sync(n))
    assert s.sync_share == pytest.approx(sync / total, rel=1e-6)

    # the pipelined executor: one thread launches graphs, another one waits for events
    launchers = {t for a, _, n, t in rows if names[n].startswith("cudaGraphLaunch") and lo <= a < hi}
    waiters = {t for _, _, n, t in rows if is_sync(n)}
    assert launchers and waiters and not launchers & waiters
    assert s.sync_share > 0.5 and s.issue_sync_share == 0.0
    assert s.verdict.regime == "host-bound" and "off the issue path" in s.verdict.reason
