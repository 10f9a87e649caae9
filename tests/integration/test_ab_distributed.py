"""The same locustfile in Locust's master/worker mode, and --check catching wrong outputs.

A headless master with ``--expect-workers 1`` and one worker process (as on two machines, here on
one), against a real tritonserver serving bert_tiny_inflight; the worker's first preparation of its requests
outlasts the run (plugins/slow_prepare.py), so the master must wait for it before starting the clock.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inflight.loadtest import stats as st
from inflight.loadtest import workload as wl
from inflight.server import control
from inflight.server.config import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
#: The worker's final statistics arrive 1.5 s late, past the 0.5 s Locust's master waits for them on its own
LATE_FINAL_REPORT = Path(__file__).resolve().parent / "plugins" / "late_final_report.py"
#: The worker's first preparation takes longer than the run, as --check's references do on a busy host
SLOW_PREPARE = Path(__file__).resolve().parent / "plugins" / "slow_prepare.py"
WORKLOAD = ["--items", "4", "--seq-len", "16", "--seed", "1"]


@pytest.fixture
def inflight_model(server: Any, repository: Path) -> Iterator[str]:
    vc = control.variant_config(repository, "bert_tiny_inflight")
    control.load_variant(server.http_url, vc)
    yield vc.model_name
    control.unload(server.http_url, vc.model_name)


def test_master_and_worker(server: Any, inflight_model: str, tmp_path: Path) -> None:
    port = free_port()
    raw = tmp_path / "raw"
    locust = [sys.executable, "-m", "locust", "-f", f"{LOCUSTFILE},{LATE_FINAL_REPORT}"]
    worker = subprocess.Popen(
        [
            *locust[:-1],
            f"{locust[-1]},{SLOW_PREPARE}",
            "--worker",
            "--master-host",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--reset-stats",
            # the same workload options as the master: the worker then prepares its requests and
            # references at start-up, not after the master started the clock (on a cold cache the
            # reference process alone can outlast the 6 s window)
            "--check",
            "--repository",
            str(server.config.model_repository),
            "--model",
            inflight_model,
            *WORKLOAD,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        master = subprocess.run(
            [
                *locust,
                "--master",
                "--master-bind-port",
                str(port),
                "--expect-workers",
                "1",
                "--expect-workers-max-wait",
                "60",
                "--headless",
                "-u",
                "10",
                "-r",
                "10",
                "-t",
                "8s",
                "--host",
                f"http://{server.http_url}",
                "--csv",
                str(tmp_path / "mw"),
                "--only-summary",
                "--reset-stats",
                "--raw-latency-dir",
                str(raw),
                "--check",
                "--repository",
                str(server.config.model_repository),
                "--model",
                inflight_model,
                *WORKLOAD,
                "TritonHttpUser",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        worker_out, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    # shown by pytest when an assertion below fails (its assertion messages are cut to a few lines)
    print(f"== master's stderr:\n{master.stderr[-4000:]}\n== worker's output:\n{worker_out[-4000:]}")
    assert master.returncode == 0, master.stderr[-3000:]
    assert worker.returncode == 0, worker_out[-3000:]
    assert "prepared again after the clock started" not in worker_out, worker_out[-3000:]
    figures = st.read_locust_stats(tmp_path / "mw_stats.csv")
    assert figures["requests"] > 0 and figures["failures"] == 0, figures
    assert "with reference outputs" in worker_out  # the worker checked every response (--check from the master)
    # the worker wrote its raw latencies; they are the requests the master counted after the reset, its last
    # report included although it came 1.5 s after the quit (the master waited for it)
    lat = st.read_raw_latencies(raw)
    assert lat.size == figures["requests"], (lat.size, figures["requests"], master.stderr[-2000:])
    # Locust keeps response times to about 2 significant digits (1 ms below 100 ms, 10 ms to 1 s, 100 ms to 10 s:
    # locust.stats.bucket_response_time) and picks its percentile by its own rank rule, so its p50 is one of the
    # requests' latencies within a rank or two of the median, to within that step (a CI run of 2026-11-26: exact
    # p50 85.3 ms, Locust's 87, a neighbour's rounded value on a sparse distribution)
    ranked = np.sort(lat)
    mid = lat.size // 2
    lo, hi = ranked[max(0, mid - 2)], ranked[min(lat.size - 1, mid + 2)]
    step = 1.0 if hi < 100 else 10.0 if hi < 1000 else 100.0
    assert lo - step <= figures["p50_ms"] <= hi + step, (lo, hi, figures["p50_ms"])


def test_check_reports_wrong_outputs(server: Any, inflight_model: str, tmp_path: Path, repository: Path) -> None:
    w = wl.Workload(model=inflight_model, items=4, seq_len=16, seed=1, pool=4)
    pool = wl.build_pool(w, repository=repository, check=True)
    assert pool.references is not None
    pool.references[2]["cls"][1, 5] += 1.0  # one wrong value in one of four requests
    path = wl.save_pool(pool, tmp_path / "pool.npz")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "-u",
            "4",
            "-r",
            "4",
            "-t",
            "3s",
            "--host",
            f"http://{server.http_url}",
            "--csv",
            str(tmp_path / "bad"),
            "--only-summary",
            "--model",
            inflight_model,
            *WORKLOAD,
            "--pool",
            "4",
            "--pool-file",
            str(path),
            "--check",
            "TritonHttpUser",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 1, r.stderr[-3000:]  # Locust's exit code when requests failed
    figures = st.read_locust_stats(tmp_path / "bad_stats.csv")
    assert 0 < figures["failures"] < figures["requests"]
    assert figures["failures"] == pytest.approx(figures["requests"] / 4, rel=0.2)
    (top,) = st.read_locust_failures(tmp_path / "bad_failures.csv")
    assert "output 'cls' differs from the PyTorch reference" in top["error"] and "worst at [1, 5]" in top["error"]
    assert np.isfinite(figures["rps"])
