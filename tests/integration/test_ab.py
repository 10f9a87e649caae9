"""The A/B runner end to end on the CPU host: a real tritonserver, real Locust, --check on.

bert_tiny_sync against bert_tiny_inflight, 20 users, 10 s windows, 4 items of 16 tokens per request
(small, so that the 2-core host stays responsive). The runner starts its own server on free ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import ab_command

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=150)]


def test_ab_smoke_on_cpu(repository: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    cmd = ab_command(
        "bert_tiny_sync",
        "bert_tiny_inflight",
        "--preset",
        "smoke",
        "--users",
        "20",
        "--check",
        # every unload takes longer than 0 s: each run must come out a slow unload, never a stall
        "--unload-timeout",
        "0",
        repository=repository,
        out=out,
        window=5,
        warmup=1,
    )
    # Locust's default master port is taken, as by an A/B run beside this one: the runner must not need it
    with contextlib.ExitStack() as stack:
        blocker = stack.enter_context(socket.socket())
        with contextlib.suppress(OSError):
            blocker.bind(("0.0.0.0", 5557))
            blocker.listen()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"inflight ab failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-4000:]}"

    (path,) = out.glob("ab-*.json")
    doc = json.loads(path.read_text())
    stem = path.with_suffix("")
    md = stem.with_suffix(".md")
    assert md.is_file()
    for suffix in ("throughput", "latency"):
        png = stem.parent / f"{stem.name}-{suffix}.png"
        assert png.read_bytes()[:4] == b"\x89PNG", png
    assert not (stem.parent / f"{stem.name}-gpu.png").exists()  # no cupti gauges on the CPU

    assert doc["valid"], doc["problems"]
    assert doc["load"]["check"] is True and doc["load"]["users"] == 20 and doc["load"]["items"] == 4
    assert doc["device"]["name"] == "cpu"
    assert doc["versions"]["tritonserver"] and doc["versions"]["locust"]
    assert [v["model_name"] for v in doc["variants"]] == ["bert_tiny_sync", "bert_tiny_inflight"]
    assert [run["variant"] for run in doc["runs"]] == ["A", "B"]
    for s in doc["summary"]:
        assert s["rps"] > 0 and s["requests"] > 0
        assert s["failures"] == 0  # --check: every response matched the PyTorch reference
        assert s["latency_ms"]["count"] == s["requests"]
        assert 0 < s["latency_ms"]["p50"] <= s["latency_ms"]["p95"] <= s["latency_ms"]["p99"]
        assert s["server"]["requests"] >= s["requests"] and s["server"]["avg_batch_items"] >= 4
        run = next(r for r in doc["runs"] if r["variant"] == s["variant"])
        assert run["requests_after_window"]["success"] >= s["requests"]  # counted since the server started
        assert s["gpu_activity"] == "not available"
        # the server tree (tritonserver + the model's stubs) did the inference on the CPU: it used CPU time,
        # the stubs part of it, and no more than the whole host was busy
        c = s["cpu"]
        assert c["windows"] == 1 and c["host_cores"] == len(os.sched_getaffinity(0))
        assert 0 < c["host_busy"] <= 1 and 0 < c["host_busy_cores"] <= c["host_cores"]
        assert 0 < c["stub_cores"] <= c["server_cores"] <= c["host_busy_cores"] * 1.05, c
        assert c["server_us_per_request"] > 0
    for run in doc["runs"]:
        assert run["locust_returncode"] == 0 and not run["cpu_warnings"]
        assert 0 <= run["unload_s"] < 60
        assert run.get("unload_slow") is True and not run.get("unload_stalled") and not run["caveats"], run
        # Triton's own counters once Locust stopped: nothing left in its queue, every request answered
        assert run["requests_after_window"]["pending"] == 0 and run["requests_after_window"]["failure"] == 0
        log = Path(run["locust_log"]).read_text()
        assert "with reference outputs" in log  # the Locust processes did load the references
    text = md.read_text()
    assert "**Status: valid**" in text and "B/A" in text and "server CPU (µs/request)" in text
    assert "bert_tiny_sync" in r.stdout and "req/s" in r.stdout

    # the report can be regenerated from the JSON alone
    md.unlink()
    r = subprocess.run(
        [sys.executable, "-m", "inflight.loadtest.cli", "ab-report", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert md.read_text() == text


def _sigterm_at(cmd: list[str], marker: str, what: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``cmd``, send it SIGTERM once it prints ``marker``; the process (ended) and all it printed."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            break
    else:
        pytest.fail(f"the A/B run ended before {what}:\n" + "".join(lines))
    os.kill(proc.pid, signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    return proc, "".join(lines) + rest


def test_sigterm_stops_the_server_and_keeps_its_log(repository: Path, tmp_path: Path) -> None:
    """`timeout` sends SIGTERM: the runner stops its server and copies the server log before exiting."""
    out = tmp_path / "results"
    cmd = ab_command(
        "bert_tiny_sync", "--preset", "smoke", "--users", "5",
        repository=repository, out=out, window=60, items=2, seq_len=8, processes=0,
    )  # fmt: skip
    proc, text = _sigterm_at(cmd, "warming up", "its warm-up")  # the window's load is running
    assert proc.returncode == 128 + signal.SIGTERM, text
    assert "SIGTERM: stopping the A/B run" in text and "tritonserver stopped" in text
    (log,) = out.glob("ab-*/tritonserver.log")
    assert "bert_tiny_sync" in log.read_text()
    assert not list(out.glob("ab-*.json"))  # nothing half-measured is written as a result
    assert not list(out.glob("interrupted-*.json"))  # no window had finished: nothing to keep


def test_sigterm_after_a_window_keeps_the_windows_measured_apart_from_the_results(
    repository: Path, tmp_path: Path
) -> None:
    """A run stopped after its first window writes that window to ``interrupted-ab-*.json`` (marked invalid)."""
    out = tmp_path / "results"
    cmd = ab_command(
        "bert_tiny_null", "bert_tiny_sync", "--rate", "20",
        repository=repository, out=out, window=2, items=2, seq_len=8,
    )  # fmt: skip
    # the second variant's run begins: the first one's record is in
    proc, text = _sigterm_at(cmd, "run 2/2", "its second window")
    assert proc.returncode == 128 + signal.SIGTERM, text
    assert not list(out.glob("ab-*.json")), "an interrupted run was written as a result"
    (path,) = out.glob("interrupted-ab-*.json")
    doc = json.loads(path.read_text())
    assert doc["interrupted"] == {"variant_runs": 1, "planned_variant_runs": 2, "windows": 1}
    assert not doc["valid"] and "interrupted after 1 of 2 variant runs (1 window(s))" in doc["problems"]
    (run,) = doc["runs"]
    assert run["model_name"] == "bert_tiny_null" and run["generator"]["completed"] > 0, run
