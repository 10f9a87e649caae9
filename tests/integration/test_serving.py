"""A real tritonserver serves every model in both our modes, over HTTP and gRPC.

Runs on the CPU host (KIND_CPU) and, with marker ``gpu``, on the GPU host (KIND_GPU): the same
tests, the same server, variants loaded with a config override of the instance kind.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tests.helpers import grpc_inputs, http_inputs, infer_or_message
from tritonclient.utils import InferenceServerException

from inflight.models import MODELS
from inflight.models.reference import error_bound, reference_outputs, relative_error
from inflight.runtime.metrics import PUBLISH_INTERVAL_S
from inflight.server.control import inference_stats, load_variant, unload, variant_config

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=250)]

MODEL_NAMES = list(MODELS)
# every mode: sync, the inflight variant as built (auto), and the pipelined and overlap modes as tagged copies of
# it (`inflight add-variant`), all loaded side by side. (An auto copy was loaded too until 2026-11-28: it differed
# from the variant as built only in chunk_items, which auto does not read, and cost five loads.)
VARIANTS = ["sync", "inflight", "inflight_pipelined", "inflight_overlap"]
#: Every mode of the models of each kind of input and output (token ids to a vector, features to logits, token ids
#: to logits); the two that only repeat a kind (bert_small: a larger bert_tiny; stacked_head: a deeper linear_head)
#: in the modes as built, sync and auto. The executors read no model: each extra mode of those was a load that
#: tested nothing the others do not (until 2026-12-01 all 20 loaded: 182 s of setup on the 2-core host).
EVERY_MODE = {"bert_tiny", "linear_head", "seqlen_head"}
AS_BUILT = ["sync", "inflight"]


def variants_of(model: str) -> list[str]:
    """The variants of ``model`` loaded here: every mode, or the modes as built."""
    return VARIANTS if model in EVERY_MODE else AS_BUILT


MODEL_VARIANTS = [(m, v) for m in MODELS for v in variants_of(m)]
# a long queue delay so that concurrent requests land in one batch
DELAY_US = "50000"
#: Variants loaded (and unloaded) at the same time.
LOADS_AT_ONCE = 4


@pytest.fixture(
    scope="module",
    params=[pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)],
)
def kind(request: pytest.FixtureRequest, server: Any, repository: Any) -> Iterator[str]:
    from inflight.build.configs import add_variant

    configs = []
    for model in MODEL_NAMES:
        for variant in variants_of(model):
            base, _, mode = variant.partition("_")
            if mode:
                # small chunks, so that the few requests of a test batch run as several chunks
                add_variant(repository, f"{model}_{base}@mode={mode},chunk_items=4", mode)
            # one instance each: the built inflight variant has one per core of this host, and 5 models x 5
            # variants of those would not fit one GPU's memory (each instance keeps its own graph pool)
            overrides = {"kind": request.param, "delay_us": DELAY_US, "instances": "1"}
            if request.param == "gpu":
                # capture only the warm-up bucket at load (the others on first use): capturing every (batch,
                # seq) bucket takes about 20 s per bert_tiny instance on an H100, and 25 such loads outlast a
                # device call; tests/gpu covers capture at load itself
                overrides["capture_at_load"] = "false"
            configs.append(variant_config(repository, f"{model}_{variant}", overrides))
    # four loads at a time: Triton loads models in parallel, and most of a Python-backend load is the stub
    # process starting (the 25 loads one after another took about two minutes on the 2-core host)
    with cf.ThreadPoolExecutor(LOADS_AT_ONCE) as pool:
        list(pool.map(lambda vc: load_variant(server.http_url, vc), configs))
    yield request.param
    with cf.ThreadPoolExecutor(LOADS_AT_ONCE) as pool:
        list(pool.map(lambda vc: unload(server.http_url, vc.model_name), configs))


def _inputs(model: str, batch: int, seed: int) -> dict[str, np.ndarray]:
    spec = MODELS[model]
    rng = np.random.default_rng(seed)
    seq = int(rng.integers(5, 70)) if spec.variable_seq else None
    return spec.example_inputs(batch, seq_len=seq, rng=rng)


@pytest.mark.parametrize(("model", "variant"), MODEL_VARIANTS)
def test_http_and_grpc_match_reference(server: Any, repository: Any, kind: str, model: str, variant: str) -> None:
    name = f"{model}_{variant}"
    out_name = MODELS[model].outputs[0].name
    batch = 2 if model == "seqlen_head" and kind == "cpu" else 7
    x = _inputs(model, batch, seed=zlib.crc32(name.encode()) % 1000)
    ref = reference_outputs(repository, model, x)
    with httpclient.InferenceServerClient(server.http_url) as c:
        y_http = c.infer(name, http_inputs(x)).as_numpy(out_name)
    with grpcclient.InferenceServerClient(server.grpc_url) as g:
        y_grpc = g.infer(name, grpc_inputs(x)).as_numpy(out_name)
    assert y_http.shape == ref.shape and y_http.dtype == np.float32
    bound = error_bound(kind == "gpu")
    assert relative_error(y_http, ref) <= bound
    assert relative_error(y_grpc, ref) <= bound


def _bad_cases() -> list[tuple[str, str, dict[str, np.ndarray], str]]:
    """(case id, model, inputs, expected message pattern)."""
    good = MODELS["bert_tiny"].example_inputs(2, seq_len=16)
    ids, mask = good["input_ids"], good["attention_mask"]
    long = MODELS["bert_tiny"].example_inputs(1, seq_len=600)
    oov = dict(good, input_ids=ids.copy())
    oov["input_ids"][1, 3] = 30522
    return [
        (
            "wrong-dtype",
            "bert_tiny",
            {"input_ids": ids.astype(np.int32), "attention_mask": mask},
            r"(?i)data ?type|INT32",
        ),
        ("wrong-rank", "bert_tiny", {"input_ids": ids[..., None], "attention_mask": mask}, r"(?i)shape|dims"),
        (
            "mismatched-seq",
            "bert_tiny",
            {"input_ids": ids, "attention_mask": mask[:, :8]},
            r"disagree on the sequence length",
        ),
        ("seq-too-long", "bert_tiny", long, r"exceeds the model's limit of 512"),
        ("token-out-of-vocab", "bert_tiny", oov, r"token id 30522 is outside the vocabulary"),
        (
            "batch-too-large",
            "linear_head",
            {"features": np.zeros((2049, 1024), np.float32)},
            r"(?i)batch.?size|max_batch_size|2048",
        ),
        ("empty-batch", "linear_head", {"features": np.zeros((0, 1024), np.float32)}, r"(?i)empty|batch|0"),
        ("missing-input", "bert_tiny", {"input_ids": ids}, r"(?i)expected 2 inputs|missing|attention_mask"),
        ("wrong-width", "linear_head", {"features": np.zeros((2, 1000), np.float32)}, r"(?i)shape|dims|1024"),
    ]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("case", "model", "inputs", "pattern"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input_gets_clear_error_and_server_stays_healthy(
    server: Any,
    repository: Any,
    kind: str,
    variant: str,
    case: str,
    model: str,
    inputs: dict[str, np.ndarray],
    pattern: str,
) -> None:
    name = f"{model}_{variant}"
    with httpclient.InferenceServerClient(server.http_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer(name, http_inputs(inputs))
        assert re.search(pattern, e.value.message()), e.value.message()
        assert c.is_server_live() and c.is_server_ready() and c.is_model_ready(name)
        x = _inputs(model, 3, seed=1)
        y = c.infer(name, http_inputs(x)).as_numpy(MODELS[model].outputs[0].name)
    assert relative_error(y, reference_outputs(repository, model, x)) <= error_bound(kind == "gpu")
    with grpcclient.InferenceServerClient(server.grpc_url) as g, pytest.raises(InferenceServerException) as eg:
        g.infer(name, grpc_inputs(inputs))
    assert re.search(pattern, eg.value.message()), eg.value.message()


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_request_fails_alone_inside_a_batch(server: Any, repository: Any, kind: str, variant: str) -> None:
    """Good and bad requests arrive together (50 ms queue delay): only the bad one fails.

    Triton batches only requests of equal shape, so all use one sequence length.
    """
    name = f"bert_tiny_{variant}"
    before = inference_stats(server.http_url, name)
    spec = MODELS["bert_tiny"]
    goods = [spec.example_inputs(3, seq_len=24, rng=np.random.default_rng(100 + i)) for i in range(8)]
    bad = spec.example_inputs(2, seq_len=24)
    bad["input_ids"][0, 0] = 10**6

    def call(x: dict[str, np.ndarray]) -> np.ndarray | str:
        return infer_or_message(server.http_url, name, x, "cls")

    with cf.ThreadPoolExecutor(len(goods) + 1) as pool:
        futures = [pool.submit(call, x) for x in [*goods[:4], bad, *goods[4:]]]
        results = [f.result() for f in futures]
    bad_result = results.pop(4)
    assert isinstance(bad_result, str) and "outside the vocabulary" in bad_result
    for x, y in zip(goods, results, strict=True):
        assert isinstance(y, np.ndarray), y
        assert relative_error(y, reference_outputs(repository, "bert_tiny", x)) <= error_bound(kind == "gpu")
    after = inference_stats(server.http_url, name)
    executions = int(after["execution_count"]) - int(before["execution_count"])
    requests = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
    assert executions < len(goods) + 1, "the requests were not batched together; the test proves nothing"
    assert requests >= len(goods)
    # Triton counts the rejected request as a success; the backend's own counter says what it was
    time.sleep(PUBLISH_INTERVAL_S + 0.1)  # the metrics are published from the next execute(), once per interval
    call(goods[0])
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    counts = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inflight_rejected_requests_total{")
        and f'model="{name}"' in line
        and 'reason="token_out_of_range"' in line
    ]
    assert counts and sum(counts) >= 1, "no inflight_rejected_requests_total{reason=token_out_of_range} series"
    log = server.log_path.read_text(errors="replace")
    assert re.search(rf"{name}: rejected a request \(token_out_of_range, \d+ so far\): token id", log)


def _metric_sum(metrics_url: str, family: str, model: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(family + "{") and f'model="{model}"' in line
    )


def test_auto_answers_in_band_then_defers_through_the_response_sender(server: Any, repository: Any, kind: str) -> None:
    """auto with ``auto_bound_min=1, auto_gain_min=0`` defers every batch once an in-band batch measured the bound.

    The first batch is answered in-band (execute() returns its responses), as is every batch of a
    reference window (10 ms at the start of each second); the deferred ones return None and are
    answered through their response senders; every answer must still be its own request's.
    """
    from inflight.build.configs import add_variant

    # metric_calls_per_execute=0: the one execute() after the interval publishes all of it (the test reads it then)
    base = (
        "bert_tiny_inflight@mode=auto,auto_bound_min=1,auto_gain_min=0,auto_probe_every_s=1,auto_probe_s=0.01,"
        "metric_calls_per_execute=0"
    )
    add_variant(repository, base, "defer")
    name = "bert_tiny_inflight_defer"
    # one instance, that sees every batch (the built variant has one per core of this host)
    overrides = {"kind": kind, "delay_us": DELAY_US, "instances": "1"}
    load_variant(server.http_url, variant_config(repository, name, overrides))
    try:
        spec = MODELS["bert_tiny"]
        work = [spec.example_inputs(3, seq_len=24, rng=np.random.default_rng(300 + i)) for i in range(27)]

        def call(x: dict[str, np.ndarray]) -> np.ndarray:
            with httpclient.InferenceServerClient(server.http_url) as c:
                return c.infer(name, http_inputs(x)).as_numpy("cls")

        results: list[np.ndarray] = []
        for lo in range(0, len(work), 9):  # three rounds of nine concurrent requests
            with cf.ThreadPoolExecutor(9) as pool:
                results += list(pool.map(call, work[lo : lo + 9]))
        for x, y in zip(work, results, strict=True):
            assert relative_error(y, reference_outputs(repository, "bert_tiny", x)) <= error_bound(kind == "gpu")
        time.sleep(PUBLISH_INTERVAL_S + 0.1)  # the metrics are published from the next execute(), once per interval
        call(work[0])
        deferred = _metric_sum(server.metrics_url, "inflight_auto_deferred_batches_total", name)
        requests = _metric_sum(server.metrics_url, "inflight_deferred_requests_total", name)
        inline = _metric_sum(server.metrics_url, "inflight_auto_inline_batches_total", name)
        reference = _metric_sum(server.metrics_url, "inflight_auto_reference_batches_total", name)
        no_gain = _metric_sum(server.metrics_url, "inflight_auto_no_gain_batches_total", name)
        assert deferred >= 1 and requests >= deferred, (deferred, requests)
        assert inline + reference >= 1 and _metric_sum(server.metrics_url, "inflight_auto_overlap_bound", name) >= 1.0
        assert no_gain == 0  # auto_gain_min=0: no probe is needed to defer
        batches = _metric_sum(server.metrics_url, "inflight_batches_total", name)
        assert inline + reference + no_gain + deferred == batches, (inline, reference, no_gain, deferred, batches)
    finally:
        unload(server.http_url, name)


def test_auto_probes_a_saturated_instance_and_from_the_high_bound_defers_without_a_gain(
    server: Any, repository: Any, kind: str
) -> None:
    """The probe rule end to end, under a steady stream: reference window, probe, deferral, skipped windows.

    ``auto_busy_min=0`` counts the instance as saturated whenever its reference window measured
    enough batches, ``auto_bound_high=1`` puts it in the high tier, and ``auto_gain_min=1000`` makes a
    loss (a gain under 1/1000) impossible: so each period's probe must end in deferral, which then
    skips the next periods' windows. Every answer must be its own request's, every batch counted once.
    """
    from inflight.build.configs import add_variant

    base = (
        "bert_tiny_inflight@mode=auto,auto_bound_min=1,auto_bound_high=1,auto_gain_min=1000,auto_busy_min=0,"
        "auto_probe_every_s=3,auto_probe_s=1,metric_calls_per_execute=0"
    )
    add_variant(repository, base, "probe")
    name = "bert_tiny_inflight_probe"
    # a short batching delay: each window must see several batches (DELAY_US's 50 ms would leave two or three)
    overrides = {"kind": kind, "delay_us": "1000", "instances": "1"}
    load_variant(server.http_url, variant_config(repository, name, overrides))
    try:
        spec = MODELS["bert_tiny"]
        work = [spec.example_inputs(2, seq_len=16, rng=np.random.default_rng(500 + i)) for i in range(8)]
        # the references before the streams start: loading the exported program is not safe from several threads
        want = [reference_outputs(repository, "bert_tiny", x) for x in work]
        wrong: list[int] = []
        start = time.monotonic()
        done = [False]

        def metric(family: str) -> float:
            return _metric_sum(server.metrics_url, family, name)

        def stream(i: int) -> int:
            sent = 0
            with httpclient.InferenceServerClient(server.http_url) as c:
                while not done[0]:
                    k = (i + sent) % len(work)
                    y = c.infer(name, http_inputs(work[k])).as_numpy("cls")
                    if relative_error(y, want[k]) > error_bound(kind == "gpu"):
                        wrong.append(k)
                    sent += 1
            return sent

        with cf.ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(stream, i) for i in range(4)]
            # five periods at least: the first probes, later ones are skipped or probe again. The windows are 1 s:
            # on the 2-core host beside the suite's other workers a 0.2 s probe window (one other worker) and a 0.5 s
            # one (three others) held no batch (too few batches to judge: the rest of the period in-band, counted
            # no_gain). The streams go on until a probe has measured a gain (published once per interval), 40 s at
            # most
            # The busy share and the gain are gauges of the newest window: sampled while the streams run, since the
            # window the streams' end cuts short may hold too few batches to judge (it then publishes a busy share
            # of 0: seen once beside three other workers)
            busy = gain = 0.0
            while time.monotonic() - start < 15.0 or (gain <= 0 and time.monotonic() - start < 40):
                time.sleep(0.5)
                busy = max(busy, metric("inflight_auto_busy_share"))
                gain = max(gain, metric("inflight_auto_gain"))
            done[0] = True
            sent = sum(f.result() for f in streams)
        assert sent > 40 and not wrong, (sent, wrong)
        time.sleep(PUBLISH_INTERVAL_S + 0.1)  # the metrics are published from the next execute(), once per interval
        with httpclient.InferenceServerClient(server.http_url) as c:
            c.infer(name, http_inputs(work[0]))

        counts = {
            k: metric(f"inflight_auto_{k}_batches_total")
            for k in ("inline", "reference", "unsaturated", "no_gain", "deferred")
        }
        assert counts["reference"] >= 4 and counts["deferred"] >= 4, counts
        assert counts["no_gain"] == 0, counts  # no loss is possible with auto_gain_min=1000
        assert sum(counts.values()) == metric("inflight_batches_total"), counts
        # a reference window was judged (busy share published) and a probe measured a gain
        assert busy > 0 and gain > 0, (busy, gain, counts)
    finally:
        unload(server.http_url, name)


def test_server_log_says_which_engine_and_device_serve(server: Any, kind: str) -> None:
    log = server.log_path.read_text(errors="replace")
    device = "CPU" if kind == "cpu" else "GPU"
    # the inflight variant as built is auto; its tagged copy inflight_pipelined is pipelined
    for variant, mode in (("sync", "sync mode"), ("inflight", "auto mode"), ("inflight_pipelined", "pipelined mode")):
        pattern = rf"bert_tiny_{variant} \(bert_tiny_{variant}_0_0\): {mode}.*torch\.export engine on {device}"
        assert re.search(pattern, log), f"no line matching {pattern!r} in the server log"
