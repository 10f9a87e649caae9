"""The null control model (``backends/null``) on a real tritonserver, over HTTP and gRPC.

It must answer every request with zeros in the model's output shape, sleep its ``sleep_us`` per
batch, and log its counters at unload in the line format the A/B reports read.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.helpers import grpc_inputs, http_inputs

from inflight.loadtest.executor_stats import executor_breakdown, executor_stats_from_log
from inflight.models import MODELS
from inflight.server.control import load_variant, unload, variant_config

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("model", ["bert_tiny", "seqlen_head"])
def test_null_model_answers_zeros_in_the_output_shape(server: Any, repository: Any, model: str) -> None:
    vc = variant_config(repository, f"{model}_null", {"kind": "cpu"})
    load_variant(server.http_url, vc)
    try:
        spec = MODELS[model]
        x = spec.example_inputs(5, seq_len=23 if spec.variable_seq else None)
        out = spec.outputs[0]
        with httpclient.InferenceServerClient(server.http_url) as c:
            y_http = c.infer(vc.model_name, http_inputs(x)).as_numpy(out.name)
        with grpcclient.InferenceServerClient(server.grpc_url) as g:
            y_grpc = g.infer(vc.model_name, grpc_inputs(x)).as_numpy(out.name)
        want = out.shape(5, 23 if out.variable else None)
        for y in (y_http, y_grpc):
            assert y.shape == want and y.dtype == np.dtype(out.dtype)
            assert not y.any()
    finally:
        unload(server.http_url, vc.model_name)


def test_null_model_sleeps_per_batch_and_logs_its_counters(server: Any, repository: Any) -> None:
    sleep_us = 200_000
    vc = variant_config(repository, "bert_tiny_null", {"kind": "cpu", "sleep_us": str(sleep_us), "delay_us": "100000"})

    def finalized() -> list[dict[str, Any]]:
        log = server.log_path.read_text(errors="replace")
        return [r for r in executor_stats_from_log(log) if r["model"] == "bert_tiny_null"]

    before = len(finalized())
    load_variant(server.http_url, vc)
    x = MODELS["bert_tiny"].example_inputs(3, seq_len=16)

    def one(_: int) -> float:
        t0 = time.perf_counter()
        with httpclient.InferenceServerClient(server.http_url) as c:
            c.infer("bert_tiny_null", http_inputs(x))
        return time.perf_counter() - t0

    try:
        with cf.ThreadPoolExecutor(6) as pool:
            took = list(pool.map(one, range(6)))
    finally:
        unload(server.http_url, "bert_tiny_null")
    assert min(took) >= sleep_us / 1e6, f"a request came back before the batch's {sleep_us} µs sleep: {took}"
    deadline = time.monotonic() + 30
    records = finalized()[before:]
    while time.monotonic() < deadline and not records:
        time.sleep(0.2)
        records = finalized()[before:]
    assert len(records) == 1, "the null instance did not log its finalized line"
    stats = records[0]["stats"]
    assert stats["requests"] == 6 and stats["responses"] == 6 and stats["items"] == 18
    assert stats["sleep_us"] == sleep_us
    # six concurrent requests and a 100 ms queue delay: fewer batches than requests, one sleep each
    assert 1 <= stats["batches"] < 6
    assert stats["device_wait_s"] >= stats["batches"] * sleep_us / 1e6
    breakdown = executor_breakdown(records)
    assert breakdown is not None and breakdown["requests_per_batch"] > 1


def test_null_model_defers_its_responses_to_sender_threads(server: Any, repository: Any) -> None:
    # sender_threads: execute() returns None at once and three threads send each response through its
    # request's response sender once the batch's stand-in device time has passed (the pipelined path)
    sleep_us = 200_000
    overrides = {"kind": "cpu", "sleep_us": str(sleep_us), "sender_threads": "3", "delay_us": "50000"}
    vc = variant_config(repository, "bert_tiny_null", overrides)
    log_start = len(server.log_path.read_text(errors="replace"))
    load_variant(server.http_url, vc)
    spec = MODELS["bert_tiny"]
    out = spec.outputs[0]

    def one(i: int) -> tuple[float, np.ndarray]:
        x = spec.example_inputs(1 + i % 4, seq_len=16)
        t0 = time.perf_counter()
        if i % 2:
            with grpcclient.InferenceServerClient(server.grpc_url) as g:
                y = g.infer("bert_tiny_null", grpc_inputs(x)).as_numpy(out.name)
        else:
            with httpclient.InferenceServerClient(server.http_url) as c:
                y = c.infer("bert_tiny_null", http_inputs(x)).as_numpy(out.name)
        assert y.shape == out.shape(1 + i % 4, None) and not y.any(), (i, y.shape)
        return time.perf_counter() - t0, y

    try:
        with cf.ThreadPoolExecutor(12) as pool:
            took = [t for t, _ in pool.map(one, range(12))]
    finally:
        unload(server.http_url, "bert_tiny_null")
    assert min(took) >= sleep_us / 1e6, f"a response was sent before its batch's {sleep_us} µs: {took}"
    deadline = time.monotonic() + 30
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not records:
        records = [
            r
            for r in executor_stats_from_log(server.log_path.read_text(errors="replace")[log_start:])
            if r["model"] == "bert_tiny_null"
        ]
        time.sleep(0.2)
    assert len(records) == 1 and records[0]["drained"], records
    stats = records[0]["stats"]
    assert stats["sender_threads"] == 3
    assert stats["requests"] == 12 and stats["responses"] == 12 and stats["send_errors"] == 0
    assert stats["send_call_s"] > 0 and stats["device_wait_s"] == 0  # execute() never waited
    # execute() returned without waiting for the stand-in device
    assert stats["execute_s"] / stats["executes"] < sleep_us / 1e6 / 4, stats
