"""The backend's failure counters are current on an idle server (issue 32, item 3).

A real server with bert_tiny_sync (sync mode) and bert_tiny_inflight (pipelined): one request with
a token outside the vocabulary is sent to an idle instance, and one second later, with no request
after it, the metrics endpoint must show ``inflight_rejected_requests_total`` one higher. The
backend publishes from the execute thread only (background calls segfaulted Triton 2.51), so this
holds only because ``execute()`` publishes its refusals at its end; a publication at the start of
the next request alone would leave the counter where it was.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inflight.loadtest.prometheus import metric_samples

pytestmark = pytest.mark.integration

MODELS = ["bert_tiny_sync", "bert_tiny_inflight"]


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from inflight.server.config import ServerConfig
    from inflight.server.launcher import TritonServer

    s = TritonServer(ServerConfig.on_free_ports(repository, tmp_path_factory.mktemp("idle"), models=MODELS))
    s.start()
    yield s
    assert s.stop() == 0


def _rejected(server: Any, model: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    return sum(v for _, v in metric_samples(text, "inflight_rejected_requests_total", model))


def _infer_out_of_vocabulary(server: Any, model: str) -> str:
    """Send one request whose token ids lie outside the vocabulary; return the server's error message."""
    from tests.helpers import http_inputs
    from tritonclient.utils import InferenceServerException

    from inflight.server.control import http_client

    ids = np.full((1, 8), 99999, dtype=np.int64)
    inputs = http_inputs({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    client = http_client(server.http_url)
    try:
        client.infer(model, inputs)
    except InferenceServerException as e:
        return str(e)
    finally:
        client.close()  # an open connection would hold the server's exit
    return ""


@pytest.mark.parametrize("model", MODELS)
def test_a_rejection_on_an_idle_server_shows_within_a_second(server: Any, model: str) -> None:
    time.sleep(0.5)  # idle: nothing else reaches this instance during the test
    before = _rejected(server, model)
    assert "outside the vocabulary" in _infer_out_of_vocabulary(server, model)
    time.sleep(1.0)
    after = _rejected(server, model)
    assert after == before + 1, f"{model}: inflight_rejected_requests_total {before} -> {after} one second later"
