"""Where the served engine's time per batch goes against the engine bound (issue 53), in one process on the GPU.

At saturation the served MiniLM's GPU was busy ~9.2 ms per batch of ~57 requests where the engine bound
(``encoder_engine.py``: the unpadded module on exactly the batch's tokens) takes ~8.2 ms. This script
times, for batches of the served workload (REQUESTS requests of 32 sequences, lengths uniform in 16-128
padded to 128 with the mask, as ``--length-dist real`` draws them):

- ``bound``: the unpadded module (``make_unpadded_module``, compiled, one CUDA graph) on the batch's
  tokens packed end to end on the host (what ``encoder_engine.py`` calls the engine bound);
- ``served``: the engine as the backend builds it from the repository's config (``runtime.assembly``):
  the batch gathered into a slot and its launch (unpadding on the device, tokens padded to the token
  bucket) replayed back to back on the compute stream, no copies;
- ``served_exact``: the same launch with a token bucket equal to the batch's kept tokens (the padding to
  the bucket left out);
- ``pipeline``: two slots launched and waited in turn (copies on the copy streams, events), one process:
  the served path's GPU time per batch with its copies, without the server.

Usage (GPU host, after the import): python3 scripts/lab/served_gap.py --model minilm2k --out gap.json; under
``nsys profile -t cuda,nvtx`` its NVTX ranges (``served_57``, ``served_exact_57``, ``pipeline_57``...) are windows for
``inflight nsys-summary --nvtx``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _batch(spec: Any, requests: int, rng: np.random.Generator) -> Any:
    from inflight.loadtest.workload import draw_inputs
    from inflight.runtime.batch import Batch, Item

    items = []
    for k in range(requests):
        x = draw_inputs(spec, 32, seq_len=128, length_dist="real", rng=rng)
        items.append(Item(inputs=x, count=32, seq=128, handle=k))
    return Batch(items)


def _bound(batch: Any, iters: int, kernels: dict[str, Any] | None = None) -> float:
    """Seconds per replay of the unpadded module on the batch's tokens packed exactly (its kernels into ``kernels``)."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from encoder_engine import _graph_time, _kernels  # type: ignore[import-not-found]  # the bound's own timing

    from inflight.models.bert import BertShape, make_unpadded_module
    from inflight.models.packing import unpad

    ids = np.concatenate([it.inputs["input_ids"] for it in batch.items])
    mask = np.concatenate([it.inputs["attention_mask"] for it in batch.items])
    u = unpad(list(ids), list(mask))
    shape = BertShape(layers=6, hidden=384, heads=12, ffn=1536)
    module = make_unpadded_module(0, shape=shape, pooling="mean", normalize=True, max_len=128).cuda().half()
    compiled = torch.compile(module, dynamic=True)
    args = [torch.from_numpy(a).cuda() for a in u.arrays()]
    seconds, _ = _graph_time(compiled, args, iters=iters)
    if kernels is not None:
        kernels["bound"] = _kernels(compiled, args, top=25)
    return float(seconds)


def main() -> None:
    """Time the four for each batch size and write the JSON."""
    import torch

    from inflight.bench.launches import time_launches
    from inflight.model_config import BackendParameters, parameters_of
    from inflight.runtime.assembly import assemble, capture_at_load
    from inflight.runtime.batch import gather
    from inflight.runtime.engines.torch_engine import TorchEngine
    from inflight.runtime.runners import CudaRunner
    from inflight.variants import parse_pbtxt, repository_spec

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="minilm2k")
    p.add_argument("--requests", type=int, action="append", help="requests a batch (repeatable; default 57 and 64)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--kernels", action="store_true", help="each one's kernels (torch.profiler, eager calls)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    d = a.repository / f"{a.model}_inflight"
    cfg = parse_pbtxt((d / "config.pbtxt").read_text())
    params = dataclasses.replace(BackendParameters.from_parameters(parameters_of(cfg)), capture_at_load=False)
    spec = repository_spec(a.repository, a.model)
    max_batch = int(cfg.max_batch_size)
    parts = assemble(params, spec, max_batch=max_batch, version_dir=d / "1", device_id=0)
    runner, layout, buckets = parts.runner, parts.layout, parts.buckets
    assert isinstance(runner, CudaRunner) and isinstance(runner.engine, TorchEngine), "a GPU host and the Torch engine"
    slots = runner.make_slots(2)
    capture_at_load(parts, params)
    engine = runner.engine
    assert isinstance(engine, TorchEngine)
    doc: dict[str, Any] = {
        "kind": "served_gap",
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "model": a.model,
        "max_batch": max_batch,
        "token_buckets": len(buckets.tokens),
        "rows": [],
    }
    rng = np.random.default_rng(7)
    for requests in a.requests or [57, 64]:
        batch = _batch(spec, min(requests, max_batch // 32), rng)
        row: dict[str, Any] = {"requests": len(batch.items), "sequences": 32 * len(batch.items)}
        kernels: dict[str, Any] | None = {} if a.kernels else None
        row["bound_s"] = _bound(batch, a.iters, kernels)
        for name, b in (("served", buckets), ("served_exact", None)):
            slot = slots[0]
            gather(layout, buckets, slot, batch)
            kept = int(sum(int(it.inputs["attention_mask"].sum()) for it in batch.items))
            if b is None:  # a token bucket of exactly the kept tokens
                b = dataclasses.replace(buckets, tokens=(kept,))
                gather(layout, b, slot, batch)
            runner.launch(slot)  # the copy in, and the bucket's capture on first use
            runner.wait(slot)
            before = dict(engine.counters)
            torch.cuda.nvtx.range_push(f"{name}_{len(batch.items)}")  # a window for `inflight nsys-summary --nvtx`
            seconds = time_launches(runner, slot.groups, a.iters, 3)
            torch.cuda.nvtx.range_pop()
            row[f"{name}_s"] = seconds
            row[f"{name}_groups"] = [
                {"bucket": list(g.bucket), "rows": g.rows, "tokens": g.tokens} for g in slot.groups
            ]
            row[f"{name}_counters"] = {k: engine.counters[k] - before.get(k, 0) for k in engine.counters}
            row["kept_tokens"] = kept
            if kernels is not None and name == "served":
                sys.path.insert(0, str(Path(__file__).parent))
                from encoder_engine import _kernels

                r, seq, tokens = engine._rows, slot.groups[0].bucket[1] or 128, slot.groups[0].tokens
                ids = engine._static_in[spec.seq_input or "input_ids"][: r * seq].view(r, seq)
                mask = engine._static_in[spec.mask_input or "attention_mask"][: r * seq].view(r, seq)
                kernels["served"] = _kernels(lambda i, m, t=tokens: engine._unpad_fn(i, m, t), [ids, mask], top=25)
                row["kernels"] = kernels
        # two slots in turn, copies included: wall time per batch in one process
        for s in slots:
            gather(layout, buckets, s, batch)
        for s in slots:
            runner.launch(s)
        for s in slots:
            runner.wait(s)
        torch.cuda.nvtx.range_push(f"pipeline_{len(batch.items)}")
        t0 = time.perf_counter()
        for i in range(a.iters):
            s = slots[i % 2]
            if i >= 2:
                runner.wait(s)
            runner.launch(s)
        for s in slots:
            runner.wait(s)
        row["pipeline_s"] = (time.perf_counter() - t0) / a.iters
        torch.cuda.nvtx.range_pop()
        for k in ("served", "served_exact", "pipeline"):
            row[f"{k}_over_bound"] = row[f"{k}_s"] / row["bound_s"]
        print(json.dumps({k: v for k, v in row.items() if not k.endswith(("_groups", "_counters"))}), flush=True)
        doc["rows"].append(row)
    runner.close()
    a.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
