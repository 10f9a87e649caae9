"""Through the real server on the GPU: concurrency correctness, in-flight depth, unload/reload under load."""

from __future__ import annotations

import concurrent.futures as cf
import re
import threading
import time
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tests.helpers import gpu_memory_mib, http_inputs
from tritonclient.utils import InferenceServerException

from inflight.loadtest.executor_stats import executor_stats_from_log
from inflight.models import MODELS
from inflight.models.reference import error_bound, reference_outputs, relative_error
from inflight.server.control import load_variant, unload, variant_config

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def _infer(url: str, name: str, x: dict[str, np.ndarray]) -> np.ndarray:
    with httpclient.InferenceServerClient(url, connection_timeout=120, network_timeout=120) as c:
        return c.infer(name, http_inputs(x)).as_numpy("cls")


def _depth_histogram(metrics_url: str, model: str) -> dict[float, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[float, float] = {}
    for m in re.finditer(
        r"^inflight_launch_depth_bucket\{(?P<labels>[^}]*)\} (?P<v>[0-9.e+]+)$", text, flags=re.MULTILINE
    ):
        labels = m.group("labels")
        if f'model="{model}"' in labels:
            le = re.search(r'le="([^"]+)"', labels)
            assert le is not None
            key = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
            out[key] = out.get(key, 0.0) + float(m.group("v"))  # summed over instances / processes
    return out


@pytest.mark.parametrize("mode", ["pipelined", "overlap", "auto"])
def test_thousands_of_concurrent_requests_each_get_their_own_result(server: Any, repository: Any, mode: str) -> None:
    name = "bert_tiny_inflight"
    # one instance, so that its batches queue behind each other (the built variant has one per core), on GPU 0:
    # without gpus= Triton puts the count on every visible GPU (four instances, four records on a 4-GPU host)
    # Triton's usual batcher delay (the build's measured one is longer on a GPU, inflight.sizing.batcher_delay_us)
    overrides = {"kind": "gpu", "instances": "1", "gpus": "0", "slots": "4", "mode": mode, "delay_us": "500"}
    if mode == "overlap":
        overrides["chunk_items"] = "128"  # batches of a few hundred items run as several chunks
        # and batches that large must form: at the default 500 us the batcher's batches sometimes all stayed
        # under 1.5 x 128 items, one chunk each (an H100, 2026-11-27: depths {1: 1891} in one run of three)
        overrides["delay_us"] = "5000"
    if mode == "auto":
        # defer whenever the measured bound allows, with no probe (every batch but the reference windows'),
        # at Triton's usual batcher delay: with the longer one the build measures on a GPU
        # (inflight.sizing.batcher_delay_us), one batch took every outstanding request of these 64 clients and
        # none was left to overlap (an H100, 2026-11-27: depths {1: 890})
        overrides.update(auto_bound_min="1", auto_gain_min="0")
    log_start = len(server.log_path.read_text(errors="replace"))
    load_variant(server.http_url, variant_config(repository, name, overrides))
    try:
        spec = MODELS["bert_tiny"]
        rng = np.random.default_rng(11)
        # distinct inputs, batch sizes 1..64 per request; two sequence lengths (Triton batches equal shapes).
        # 256 clients keep ~8,300 items outstanding, four times max_batch_size (2,048): a full batch is always
        # waiting while one runs. With 64 (~2,080 items, one batch's worth) one batch could take every outstanding
        # request, leaving none to launch behind it (an H100, 2026-11-28, pipelined: depths {1: 1037}).
        work = [
            spec.example_inputs(int(rng.integers(1, 65)), seq_len=int(rng.choice([32, 64])), rng=rng)
            for _ in range(3000)
        ]
        with cf.ThreadPoolExecutor(256) as pool:
            results = list(pool.map(lambda x: _infer(server.http_url, name, x), work))
        worst = 0.0
        for x, y in zip(work, results, strict=True):
            assert y.shape == (len(x["input_ids"]), 128)
            worst = max(worst, relative_error(y, reference_outputs(repository, "bert_tiny", x)))
        print(f"3000 concurrent requests: worst relative error {worst:.2e}")
        assert worst <= error_bound(True)
        # the endpoint exports the depth as a sample of the launches (``HISTOGRAM_SAMPLE`` per publication)
        hist = _depth_histogram(server.metrics_url, name)
        print(f"launch-depth histogram (cumulative, sampled): {hist}")
        assert hist and hist[float("inf")] > 0, "no inflight_launch_depth metric exported"
    finally:
        unload(server.http_url, name)
    # every launch's depth, counted exactly, is in the instance's finalize record
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not records:
        text = server.log_path.read_text(errors="replace")[log_start:]
        records = [r for r in executor_stats_from_log(text) if r["model"] == name]
        time.sleep(0.2)
    assert len(records) == 1 and records[0]["drained"], records
    stats = records[0]["stats"]
    depths = {int(k): n for k, n in stats["depth_launches"].items()}  # JSON keys: the depth, as text
    print(f"launches by depth (exact): {depths}")
    deeper = sum(n for k, n in depths.items() if k > 1)
    assert stats["max_depth"] > 1 and deeper > 0, f"every batch launched alone: nothing was in flight: {depths}"


def test_unload_and_reload_under_load_no_hang_no_leak(server: Any, repository: Any) -> None:
    name = "bert_tiny_inflight"
    vc = variant_config(repository, name, {"kind": "gpu", "instances": "2"})
    used_before = gpu_memory_mib()[0]
    load_variant(server.http_url, vc)
    spec = MODELS["bert_tiny"]
    stop = threading.Event()
    outcomes: dict[str, int] = {"ok": 0, "error": 0, "wrong": 0}
    errors: list[str] = []
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            x = spec.example_inputs(50, seq_len=64, rng=rng)
            try:
                y = _infer(server.http_url, name, x)
                ok = relative_error(y, reference_outputs(repository, "bert_tiny", x)) <= error_bound(True)
                key = "ok" if ok else "wrong"
            except InferenceServerException as e:
                key = "error"
                with lock:
                    errors.append(e.message())
            with lock:
                outcomes[key] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    time.sleep(5)
    t0 = time.monotonic()
    unload(server.http_url, name, timeout_s=120)
    unload_s = time.monotonic() - t0
    time.sleep(2)
    used_unloaded = gpu_memory_mib()[0]
    load_variant(server.http_url, vc)
    time.sleep(5)
    stop.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a client hung"
    print(
        f"outcomes {outcomes}; unload took {unload_s:.1f} s; "
        f"GPU used before {used_before} MiB, after unload {used_unloaded} MiB"
    )
    print("distinct errors:", sorted(set(e[:120] for e in errors))[:5])
    assert unload_s < 60
    assert outcomes["ok"] > 100
    assert outcomes["wrong"] == 0, "a response carried another request's result"
    assert used_unloaded <= used_before + 64, "GPU memory not returned after unload"
    with httpclient.InferenceServerClient(server.http_url) as c:
        assert c.is_server_ready() and c.is_model_ready(name)
    unload(server.http_url, name)


def test_out_of_vocabulary_tokens_never_reach_the_device(server: Any, repository: Any) -> None:
    """A device-side index fault would poison the CUDA context; rejected ids must leave it healthy."""
    name = "bert_tiny_sync"
    load_variant(server.http_url, variant_config(repository, name, {"kind": "gpu"}))
    try:
        spec = MODELS["bert_tiny"]
        for bad_id in (30522, 10**9, -5):
            x = spec.example_inputs(4, seq_len=64)
            x["input_ids"][2, 5] = bad_id
            with pytest.raises(InferenceServerException, match="outside the vocabulary"):
                _infer(server.http_url, name, x)
        x = spec.example_inputs(8, seq_len=64)
        y = _infer(server.http_url, name, x)
        assert relative_error(y, reference_outputs(repository, "bert_tiny", x)) <= error_bound(True)
    finally:
        unload(server.http_url, name)


def test_without_capture_at_load_the_warm_up_bucket_is_still_captured(server: Any, repository: Any) -> None:
    """capture_at_load=false captures the warm-up sequence bucket at load (every batch bucket), the rest lazily."""
    name = "bert_tiny_sync"
    load_variant(server.http_url, variant_config(repository, name, {"kind": "gpu", "capture_at_load": "false"}))
    try:
        lines = [
            line
            for line in server.log_path.read_text(errors="replace").splitlines()
            if f"{name} ({name}_0_0): sync mode" in line and "ready in" in line
        ]
        assert lines, "no ready line of the instance in the server log"
        m = re.search(r"; (\d+) CUDA graph\(s\)", lines[-1])
        assert m and int(m.group(1)) > 0, lines[-1]
    finally:
        unload(server.http_url, name)
