"""One tritonserver per GPU behind a real load balancer (issue 54's layout), on the CPU host: nginx over two servers.

Two real tritonservers serve the null control model; nginx (``inflight.server.balancer``) balances one
client's requests over them. Every answer must be right, both servers must have answered a share (their
own Prometheus counters say), and nginx and both servers must be gone at the end.
"""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tests.helpers import http_inputs

from inflight.loadtest.prometheus import metric_values
from inflight.models import MODELS
from inflight.server.balancer import Balancer, find_nginx
from inflight.server.config import ServerConfig, free_port
from inflight.server.launcher import TritonServer
from inflight.tool_errors import ServerError

pytestmark = pytest.mark.integration

MODEL = "bert_tiny_null"
REQUESTS = 40


@pytest.fixture
def nginx() -> Path:
    try:
        return find_nginx()
    except ServerError as e:
        pytest.skip(str(e))


@pytest.fixture
def two_servers(repository: Path, tmp_path: Path) -> Iterator[list[TritonServer]]:
    servers: list[TritonServer] = []
    try:
        for i in range(2):
            config = ServerConfig.on_free_ports(repository, tmp_path / f"triton{i}", models=[MODEL])
            servers.append(TritonServer(config).start())
        yield servers
    finally:
        for s in servers:
            with contextlib.suppress(Exception):
                s.stop()


def _answered(server: TritonServer) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    return sum(metric_values(text, "nv_inference_request_success", MODEL))


def test_nginx_spreads_the_requests_over_both_servers_and_every_answer_is_right(
    nginx: Path, two_servers: list[TritonServer], tmp_path: Path
) -> None:
    spec = MODELS["bert_tiny"]
    out = spec.outputs[0].name
    balancer = Balancer([s.http_url for s in two_servers], free_port(), tmp_path / "nginx", nginx=nginx)
    with balancer:
        balancer.ready()
        client = httpclient.InferenceServerClient(url=balancer.url)
        rng = np.random.default_rng(3)
        for _ in range(REQUESTS):
            x = spec.example_inputs(int(rng.integers(1, 9)), seq_len=16, rng=rng)
            y = client.infer(MODEL, http_inputs(x)).as_numpy(out)
            assert y is not None and y.shape == (len(x["input_ids"]), spec.outputs[0].dims[0])
        client.close()
        proc = balancer.proc
        assert proc is not None and proc.poll() is None
    assert proc.poll() is not None, "nginx still running after the balancer stopped"
    shares = [_answered(s) for s in two_servers]
    assert sum(shares) == REQUESTS and all(n > 0 for n in shares), shares
