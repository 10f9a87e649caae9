"""A failure inside ``execute()`` answers every request with what failed, and the server carries on.

A real tritonserver on the CPU host serves a model whose ``model.py`` is the real backend object
(``InflightModel``) with two faults injected, standing in for a bug: reading a marked request
raises (that request must fail alone, the rest of its batch runs), and a batch holding another
mark raises in ``execute()`` after parsing (each of its requests gets an error that says what
failed, and the next batch is served). Every mode is checked: sync, pipelined, overlap and auto.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tests.helpers import http_inputs
from tritonclient.utils import InferenceServerException

from inflight.models import MODELS
from inflight.models.reference import error_bound, reference_outputs, relative_error
from inflight.server.control import http_client, inference_stats, unload

pytestmark = pytest.mark.integration

PARSE_FAULT = 777
EXECUTE_FAULT = 778

MODEL_PY = f'''"""bert_tiny through the real InflightModel, with two injected faults (tests only)."""
import triton_python_backend_utils as pb_utils

from inflight.runtime import triton_model
from inflight.runtime.reading import RequestReader


def _mark(request):
    ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
    return int(ids[0, 1]) if ids.ndim == 2 and ids.shape[1] > 1 else 0


class _FaultyReader(RequestReader):
    def __call__(self, request):
        if _mark(request) == {PARSE_FAULT}:
            raise RuntimeError("injected fault while reading the request")
        return super().__call__(request)


# this stub process serves this one instance: its InflightModel reads requests through _FaultyReader
triton_model.RequestReader = _FaultyReader


class _Faulty(triton_model.InflightModel):
    def _execute(self, requests):
        if any(_mark(r) == {EXECUTE_FAULT} for r in requests):
            raise KeyError("injected fault in execute")
        return super()._execute(requests)


class TritonPythonModel:
    def initialize(self, args):
        self._model = _Faulty(args, pb_utils)

    def execute(self, requests):
        return self._model.execute(requests)

    def finalize(self):
        self._model.finalize()
'''

MODES = ["sync", "pipelined", "overlap", "auto"]


def _config(repository: Path, name: str, mode: str) -> str:
    text = (repository / "bert_tiny_sync" / "config.pbtxt").read_text()
    text = text.replace('name: "bert_tiny_sync"', f'name: "{name}"')
    text = text.replace('backend: "inflight"', 'backend: "python"')
    text = re.sub(r'(key: "mode"\s*value \{\s*string_value: )"sync"', rf'\1"{mode}"', text)
    # the few requests of a test batch must land in one batch: threads that start their clients 50 ms apart on a
    # busy 2-core host did not (a CI run's batch of 3 ran as 2), so the batcher waits 300 ms
    text = re.sub(r"max_queue_delay_microseconds: \d+", "max_queue_delay_microseconds: 300000", text)
    text = re.sub(r"instance_group \{\s*count: 1\s*\}", "instance_group {\n  count: 1\n  kind: KIND_CPU\n}", text)
    assert f'string_value: "{mode}"' in text and 'backend: "python"' in text and "KIND_CPU" in text, text
    if mode in ("overlap", "auto"):  # small chunks: the few requests of a test batch run as several
        text += 'parameters {\n  key: "chunk_items"\n  value {\n    string_value: "4"\n  }\n}\n'
    return text


@pytest.fixture(scope="module")
def faulty(server: Any, repository: Path) -> Iterator[dict[str, str]]:
    """One faulty model per mode, loaded on the session's server; unloaded and removed afterwards."""
    names: dict[str, str] = {}
    dirs: list[Path] = []
    client = http_client(server.http_url, network_timeout=600.0, connection_timeout=600.0)
    try:
        for mode in MODES:
            name = f"bert_tiny_inflight_faulty{mode}"  # <model>_inflight_<tag>: the backend names the model from it
            d = repository / name
            shutil.rmtree(d, ignore_errors=True)
            (d / "1").mkdir(parents=True)
            dirs.append(d)
            (d / "config.pbtxt").write_text(_config(repository, name, mode))
            (d / "1" / "model.py").write_text(MODEL_PY)
            for artifact in (repository / "bert_tiny_sync" / "1").iterdir():
                if artifact.name != ".gitkeep":
                    (d / "1" / artifact.name).symlink_to(artifact.resolve())
            client.load_model(name)
            names[mode] = name
        yield names
    finally:
        client.close()
        for name in names.values():
            unload(server.http_url, name)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def _call(url: str, name: str, x: dict[str, np.ndarray]) -> np.ndarray | str:
    with httpclient.InferenceServerClient(url) as c:
        try:
            return c.infer(name, http_inputs(x)).as_numpy("cls")
        except InferenceServerException as e:
            return e.message()


def _batch(url: str, name: str, xs: list[dict[str, np.ndarray]]) -> list[np.ndarray | str]:
    with cf.ThreadPoolExecutor(len(xs)) as pool:
        return [f.result() for f in [pool.submit(_call, url, name, x) for x in xs]]


def _inputs(seed: int, mark: int = 0) -> dict[str, np.ndarray]:
    x = MODELS["bert_tiny"].example_inputs(3, seq_len=24, rng=np.random.default_rng(seed))
    if mark:
        x["input_ids"][0, 1] = mark
        x["attention_mask"][0, 1] = 1
    return x


@pytest.mark.parametrize("mode", MODES)
def test_unreadable_request_fails_alone_inside_a_batch(
    server: Any, repository: Path, faulty: dict[str, str], mode: str
) -> None:
    name = faulty[mode]
    before = inference_stats(server.http_url, name)
    goods = [_inputs(200 + i) for i in range(6)]
    results = _batch(server.http_url, name, [*goods[:3], _inputs(300, PARSE_FAULT), *goods[3:]])
    bad = results.pop(3)
    assert isinstance(bad, str) and "could not read this request (RuntimeError: injected fault" in bad, bad
    for x, y in zip(goods, results, strict=True):
        assert isinstance(y, np.ndarray), y
        assert relative_error(y, reference_outputs(repository, "bert_tiny", x)) <= error_bound(False)
    after = inference_stats(server.http_url, name)
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert executions < len(goods) + 1, "the requests were not batched together; the test proves nothing"


@pytest.mark.parametrize("mode", MODES)
def test_failed_execute_answers_each_request_and_the_server_carries_on(
    server: Any, repository: Path, faulty: dict[str, str], mode: str
) -> None:
    name = faulty[mode]
    before = inference_stats(server.http_url, name)
    xs = [_inputs(400), _inputs(401, EXECUTE_FAULT), _inputs(402)]
    results = _batch(server.http_url, name, xs)
    after = inference_stats(server.http_url, name)
    assert int(after["execution_count"]) - int(before["execution_count"]) == 1, "not one batch: proves nothing"
    for y in results:
        assert isinstance(y, str), "a request of the failed batch got outputs"
        assert f"{name}: the backend failed on this request's batch (KeyError: 'injected fault in execute')" in y, y
        assert "server log has the traceback" in y
    # the next batch is served
    x = _inputs(403)
    y = _call(server.http_url, name, x)
    assert isinstance(y, np.ndarray), y
    assert relative_error(y, reference_outputs(repository, "bert_tiny", x)) <= error_bound(False)
    log = server.log_path.read_text(errors="replace")
    assert re.search(rf"{name} \(.*\): execute\(\) failed for 3 requests \(\d+ failures so far\)", log)
    assert "KeyError: 'injected fault in execute'" in log  # the traceback
