"""The ``plain`` baseline (``backends/plain``) on a real tritonserver: the usual Python-backend deployment.

It must compute what the other variants compute (the exported module's outputs, within the fp32
CPU bound), refuse a bad request alone inside a batch with the model's own message, and log its
counters at unload in the ``finalized`` line format the A/B reports read.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.helpers import grpc_inputs, http_inputs, infer_or_message

from inflight.loadtest.executor_stats import executor_stats_from_log
from inflight.models import MODELS
from inflight.models.reference import error_bound, reference_outputs, relative_error
from inflight.server.control import load_variant, unload, variant_config

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("model", ["bert_tiny", "stacked_head"])
def test_plain_model_matches_the_reference(server: Any, repository: Any, model: str) -> None:
    vc = variant_config(repository, f"{model}_plain", {"kind": "cpu"})
    load_variant(server.http_url, vc)
    try:
        spec = MODELS[model]
        x = spec.example_inputs(5, seq_len=23 if spec.variable_seq else None, rng=np.random.default_rng(7))
        out = spec.outputs[0].name
        with httpclient.InferenceServerClient(server.http_url) as c:
            y_http = c.infer(vc.model_name, http_inputs(x)).as_numpy(out)
        with grpcclient.InferenceServerClient(server.grpc_url) as g:
            y_grpc = g.infer(vc.model_name, grpc_inputs(x)).as_numpy(out)
        ref = reference_outputs(repository, model, x)
        for y in (y_http, y_grpc):
            assert y.shape == ref.shape and y.dtype == np.float32
            assert relative_error(y, ref) <= error_bound(False)
    finally:
        unload(server.http_url, vc.model_name)


def test_plain_model_fails_a_bad_request_alone_and_logs_its_counters(server: Any, repository: Any) -> None:
    name = "bert_tiny_plain"
    vc = variant_config(repository, name, {"kind": "cpu", "delay_us": "50000"})
    spec = MODELS["bert_tiny"]
    goods = [spec.example_inputs(2, seq_len=24, rng=np.random.default_rng(200 + i)) for i in range(6)]
    bad = spec.example_inputs(2, seq_len=24)
    bad["input_ids"][1, 5] = 10**6

    def call(x: dict[str, np.ndarray]) -> np.ndarray | str:
        return infer_or_message(server.http_url, name, x, "cls")

    def finalized() -> list[dict[str, Any]]:
        log = server.log_path.read_text(errors="replace")
        return [r for r in executor_stats_from_log(log) if r["model"] == name]

    before = len(finalized())
    load_variant(server.http_url, vc)
    try:
        with cf.ThreadPoolExecutor(len(goods) + 1) as pool:
            results = list(pool.map(call, [*goods[:3], bad, *goods[3:]]))
    finally:
        unload(server.http_url, name)
    bad_result = results.pop(3)
    assert isinstance(bad_result, str) and "outside the vocabulary" in bad_result, bad_result
    for x, y in zip(goods, results, strict=True):
        assert isinstance(y, np.ndarray), y
        assert relative_error(y, reference_outputs(repository, "bert_tiny", x)) <= error_bound(False)
    deadline = time.monotonic() + 30
    records = finalized()[before:]
    while time.monotonic() < deadline and not records:
        time.sleep(0.2)
        records = finalized()[before:]
    assert len(records) == 1, "the plain instance did not log its finalized line"
    stats = records[0]["stats"]
    assert stats["requests"] == 7 and stats["responses"] == 6 and stats["rejected"] == 1 and stats["errors"] == 0
    assert stats["items"] == 12
    assert 1 <= stats["batches"] < 7, "the requests were not batched together; the test proves less"
