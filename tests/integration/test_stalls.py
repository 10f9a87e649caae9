"""Diagnostics for a stub that will not exit, taken from a real server's live stub.

A stub that never exits after finalize holds Triton's unload forever (``waitpid`` with no limit).
The A/B runner then calls ``dump_stuck_stubs``; here it runs against a healthy stub of a real
tritonserver, which must answer the same way: Python stacks in the server log (faulthandler on
SIGUSR2, installed by the backend), thread states from /proc, native stacks where a debugger is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from inflight.lab.stalls import dump_stuck_stubs, find_debugger, stub_processes, thread_states
from inflight.loadtest.runner.metrics import scrape
from inflight.loadtest.stats import request_state
from inflight.server.control import load_variant, unload, variant_config

pytestmark = pytest.mark.integration

MODEL = "bert_tiny_sync"


def _wait_for(predicate: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_dump_of_a_live_stub(server: Any, repository: Path, tmp_path: Path) -> None:
    vc = variant_config(repository, MODEL, {"kind": "cpu", "instances": "2"})
    load_variant(server.http_url, vc)
    try:
        stubs = stub_processes(MODEL, parent_pid=server.process.pid)
        assert len(stubs) == 2, f"expected the 2 instances' stubs of {MODEL}, found {stubs}"
        assert {s.parent_pid for s in stubs} == {server.process.pid}
        assert stub_processes(MODEL, parent_pid=1) == []  # another server's stubs are not ours
        assert {s.instance for s in stubs} == {f"{MODEL}_0_0", f"{MODEL}_0_1"}
        assert stub_processes("no_such_model") == []

        log_before = server.log_path.read_text(errors="replace")
        files = dump_stuck_stubs(MODEL, tmp_path, parent_pid=server.process.pid, gdb_timeout_s=60, max_native=1)
        assert sorted(f.name for f in files) == sorted(f"stuck-stub-{s.pid}.txt" for s in stubs)
        text = files[0].read_text()
        assert f"model {MODEL}" in text
        # every stub has its main thread plus Triton's own; each line names a state
        assert len([ln for ln in text.splitlines() if " state " in ln]) >= 2
        if find_debugger():
            # a debugger that cannot attach in time is reported as such (seen with cuda-gdb on a busy GPU host)
            assert "thread apply all bt" in text or "did not finish within 60 s" in text
            assert "taken for the first 1 stub(s) only" in files[1].read_text()
        else:
            assert "no cuda-gdb or gdb here" in text

        def stacks_logged() -> bool:
            new = server.log_path.read_text(errors="replace")[len(log_before) :]
            return new.count("Most recent call first") >= 2 or new.count("Current thread") >= 2

        assert _wait_for(stacks_logged), "faulthandler's Python stacks did not reach the server log"
        # the signal did no harm: the model still answers its health query after the dump
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(server.http_url)
        try:
            assert client.is_model_ready(MODEL)
        finally:
            client.close()
    finally:
        unload(server.http_url, MODEL)
    exited = _wait_for(lambda: not stub_processes(MODEL))
    left = {} if exited else {s.pid: thread_states(s.pid) for s in stub_processes(MODEL)}
    assert exited, f"the stubs did not exit after unload; their threads: {left}"


def test_request_state_of_a_live_server(server: Any, repository: Path) -> None:
    """The request counters the runner records after each window and at a stall exist in 2.51."""
    import numpy as np
    import tritonclient.http as httpclient

    vc = variant_config(repository, MODEL, {"kind": "cpu", "instances": "1"})
    load_variant(server.http_url, vc)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            inputs = []
            for name in ("input_ids", "attention_mask"):
                arr = np.ones((3, 64), dtype=np.int64)
                inputs.append(httpclient.InferInput(name, list(arr.shape), "INT64"))
                inputs[-1].set_data_from_numpy(arr)
            client.infer(MODEL, inputs)
        finally:
            client.close()
        text = scrape(server.metrics_url)
        assert text is not None
        state = request_state(text, MODEL)
        assert state["pending"] == 0  # nothing queued once the response came back
        assert state["success"] == 1 and state["failure"] == 0 and state["executions"] == 1, state
        assert all(f'model="{MODEL}"' in ln for ln in state["lines"]) and len(state["lines"]) >= 4
    finally:
        unload(server.http_url, MODEL)
