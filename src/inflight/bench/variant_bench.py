"""Engine-only time of every engine the bench compares, and the mixed-length measurements.

:func:`bench_variants` loads each variant of :func:`~inflight.bench.config.variants_for` as the
server would and times its launches per batch size; the served engine also runs the load test's
requests as served (:func:`served_request_rows`) and, for variable-length models, a mixed-length
batch (with the packed and unpadded models of :mod:`~inflight.bench.unpadded` for bert_tiny).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from inflight.bench.config import BenchConfig, Variant, bench_spec, variants_for
from inflight.bench.launches import fill_slot, launch_group, time_launches
from inflight.bench.unpadded import packed_mixed_row, unpadded_row
from inflight.model_config import BackendParameters
from inflight.models.artifact import load_module
from inflight.models.registry import MODELS
from inflight.runtime.assembly import assemble, capture_at_load
from inflight.runtime.batch import GPU_LAUNCH_COST_TOKENS, Batch, Buckets, Item, gather, outputs_for
from inflight.runtime.engines.torch_engine import TorchEngine
from inflight.runtime.runners import CudaRunner

LOGGER = logging.getLogger(__name__)


def _artifact(cfg: BenchConfig, v: Variant, tmp: Path) -> Path:
    if v.module is None:
        return cfg.artifact
    from inflight.build.export import export_torch

    spec = bench_spec(cfg)
    path = tmp / ("-".join(f"{k}={val}" for k, val in v.module) + ".pt2")
    if not path.is_file():
        export_torch(spec, spec.build_module(0, **dict(v.module)), path)
    return path


def _max_abs_error(runner: CudaRunner, spec: Any, seq: int | None, reference: Any) -> float:
    """Largest ``|served - fp32 CPU reference|`` over 256 items with padded masks."""
    import torch

    rows = min(256, runner.layout.max_items)
    x = spec.example_inputs(rows, seq_len=seq, rng=np.random.default_rng(1))
    slot = runner.slots[0]
    batch = Batch([Item(inputs=x, count=rows, seq=seq, handle=0)])
    gather(runner.layout, runner.buckets, slot, batch)
    runner.launch(slot)
    runner.wait(slot)
    (out,) = outputs_for(runner.layout, slot)
    got = next(iter(out.values())).astype(np.float64)
    with torch.inference_mode():
        ref = reference(*[torch.from_numpy(x[t.name]) for t in spec.inputs]).double().numpy()
    return float(np.abs(got - ref).max())


def _mixed_batch(spec: Any, rows: int, lengths: tuple[int, int] | None, per_request: int, rng: Any) -> Batch:
    items = []
    left, k = rows, 0
    while left > 0:
        c = min(per_request, left)
        seq = int(rng.integers(lengths[0], lengths[1] + 1)) if lengths else spec.default_seq_len
        items.append(Item(inputs=spec.example_inputs(c, seq_len=seq, rng=rng), count=c, seq=seq, handle=k))
        left -= c
        k += 1
    return Batch(items)


def _unmasked(batch: Batch) -> Batch:
    """The batch with every token unmasked (ids of masked tokens set to 1): no token to leave out."""
    items = []
    for it in batch.items:
        mask = it.inputs["attention_mask"]
        ids = np.where(mask != 0, it.inputs["input_ids"], 1)
        items.append(
            Item(
                inputs={"input_ids": ids, "attention_mask": np.ones_like(mask)},
                count=it.count,
                seq=it.seq,
                handle=it.handle,
            )
        )
    return Batch(items)


def served_request_rows(runner: CudaRunner, v: Variant, cfg: BenchConfig, reference: Any) -> list[dict[str, Any]]:
    """The served engine on batches of the load test's ``--length-dist uniform`` requests, as served.

    Each batch (``items_per_request`` items of ``seq_len`` per request, each item's length uniform
    in 1..``seq_len``, the rest masked: ``inflight.loadtest.workload.draw_inputs``) is planned,
    gathered and launched as the executors do, so the launch runs unpadded when the plan says so
    (``unpad``); the launches are then replayed back to back. Returns one row per batch size with
    the launch's tokens and the largest error against the fp32 CPU model over the first 256 items.
    """
    import torch

    from inflight.loadtest.workload import draw_inputs

    spec, slot = runner.engine.spec, runner.slots[0]  # type: ignore[attr-defined]
    out = []
    rng = np.random.default_rng(9)
    for b in cfg.batches:
        items: list[Item] = []
        left = b
        while left > 0:
            c = min(cfg.items_per_request, left)
            x = draw_inputs(spec, c, seq_len=cfg.seq_len, length_dist="uniform", rng=rng)
            items.append(Item(inputs=x, count=c, seq=cfg.seq_len, handle=len(items)))
            left -= c
        batch = Batch(items)
        gather(runner.layout, runner.buckets, slot, batch)
        runner.launch(slot)  # the first use captures the token bucket's graph
        runner.wait(slot)
        runner.launch(slot)
        runner.wait(slot)
        err, n = 0.0, 0
        with torch.inference_mode():
            for item, got in zip(batch.items, outputs_for(runner.layout, slot), strict=True):
                if n >= 256:
                    break
                want = reference(*[torch.from_numpy(item.inputs[t.name]) for t in spec.inputs]).numpy()
                err = max(err, float(np.abs(got[spec.outputs[0].name] - want).max()))
                n += item.count
        t = time_launches(runner, slot.groups, cfg.iters, cfg.warmup)
        row = {
            "engine": f"{v.label}, requests of lengths 1-{cfg.seq_len} padded to {cfg.seq_len}, as served",
            "batch": b,
            "compile": v.compile,
            "precision": v.precision,
            "engine_us_per_batch": t * 1e6,
            "engine_ms_per_batch": t * 1e3,
            "engine_bound_items_s": b / t,
            "workload": f"length_dist uniform, seq {cfg.seq_len}",
            "launches": [[*g.bucket, g.rows, g.tokens] for g in slot.groups],
            "unpadded_launches": sum(g.tokens is not None for g in slot.groups),
            "real_tokens": slot.real_tokens,
            "kept_tokens": sum(int(np.count_nonzero(it.inputs[spec.mask_input or ""])) for it in batch.items),
            "computed_tokens": slot.padded_tokens,
            "max_abs_error_vs_fp32_cpu": err,
        }
        LOGGER.info("%s", json.dumps(row))
        out.append(row)
    return out


def bench_variants(cfg: BenchConfig, tmp: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Engine-only time per batch of every variant, its load time and error, and the mixed-length row.

    Returns:
        Rows (one per variant and batch size) and the mixed-length result of the served engine.
    """
    import torch

    from inflight.bench.floor import batch_work, floor_us, peak_for
    from inflight.runtime import cuda

    spec = bench_spec(cfg)
    seq = cfg.seq_len if spec.variable_seq else None
    peak = peak_for(cuda.device_name(cfg.device_id))
    # a repository model's reference is its own artifact, run eagerly in fp32
    built_in = cfg.model in MODELS
    reference = spec.build_module(0, **spec.reference_options) if built_in else load_module(cfg.artifact)
    mixed_seqs: tuple[int, ...] | None = None
    if spec.variable_seq:
        mixed_seqs = tuple(s for s in BackendParameters().seq_buckets if s <= max(cfg.mixed[1], seq or 0))
    max_rows = max(cfg.batches)
    rows_out: list[dict[str, Any]] = []
    mixed: dict[str, Any] = {}
    work = {b: batch_work(spec, reference, b, seq, cfg.precision) for b in cfg.batches}
    for i, v in enumerate(variants_for(cfg.model, cfg.precision, spec)):
        t0 = time.perf_counter()
        artifact = _artifact(cfg, v, tmp)
        # the served engine as the server builds and loads it (every batch bucket and the unpadded
        # graphs at the warm-up length); the others at the measured batch sizes only
        params = BackendParameters(
            engine="torch",
            precision=v.precision,  # type: ignore[arg-type]
            compile=v.compile,  # type: ignore[arg-type]
            max_graphs=512,
            unpad=i == 0,
            batch_buckets=() if i == 0 else tuple(sorted(set(cfg.batches))),
            seq_buckets=mixed_seqs or BackendParameters().seq_buckets,
            warmup_seq_len=seq or BackendParameters().warmup_seq_len,
            capture_at_load=False,
            artifact=artifact.name,
        )
        parts = assemble(params, spec, max_batch=max_rows, version_dir=artifact.parent, device_id=cfg.device_id)
        runner, layout, buckets = parts.runner, parts.layout, parts.buckets
        engine = parts.engine
        assert isinstance(runner, CudaRunner) and isinstance(engine, TorchEngine)
        runner.make_slots(1)
        try:
            capture_at_load(parts, params)
            load_s = time.perf_counter() - t0
            err = _max_abs_error(runner, spec, seq, reference)
            # engine-only launches read the slot's device buffers: fill them all with valid inputs
            fill_slot(runner, spec, mixed_seqs[-1] if mixed_seqs else None)
            for b in cfg.batches:
                t = time_launches(runner, [launch_group(b, seq, spec)], cfg.iters, cfg.warmup)
                flops, nbytes = work[b]
                row = {
                    "engine": v.label,
                    "batch": b,
                    "compile": v.compile,
                    "precision": v.precision,
                    "engine_us_per_batch": t * 1e6,
                    "engine_ms_per_batch": t * 1e3,
                    "engine_bound_items_s": b / t,
                    "floor_us_per_batch": None if peak is None else floor_us(flops, nbytes, peak, v.precision),
                    "flops_per_batch": flops,
                    "bytes_per_batch": nbytes,
                    "max_abs_error_vs_fp32_cpu": err,
                    "load_s": load_s,
                    "graph_memory_mb": engine.graph_memory_mb(),
                }
                LOGGER.info("%s", json.dumps(row))
                rows_out.append(row)
            if engine.unpads:
                floors = {r["batch"]: r["floor_us_per_batch"] for r in rows_out if r["engine"] == v.label}
                for r in served_request_rows(runner, v, cfg, reference):
                    # the same job as the padded row of its size: its floor; the engine's load
                    rows_out.append({**r, "floor_us_per_batch": floors.get(r["batch"]), "load_s": load_s})
            if i == 0 and mixed_seqs is not None:
                t1 = time.perf_counter()
                runner.warmup(mixed_seqs)  # every bucket the mixed batch can use
                capture_all_s = time.perf_counter() - t1
                rng = np.random.default_rng(2)
                b = max_rows
                res: dict[str, Any] = {}
                by_cost: dict[int, Any] = {}
                mixed_batch = _mixed_batch(spec, b, cfg.mixed, cfg.items_per_request, rng)
                for cost in (0, 2048, GPU_LAUNCH_COST_TOKENS // 2, GPU_LAUNCH_COST_TOKENS * 2):
                    # the grouping's launch price: what the served one (GPU_LAUNCH_COST_TOKENS) is weighed against
                    alt = Buckets(buckets.batch, buckets.seq, cost)
                    slot = runner.slots[0]
                    gather(layout, alt, slot, mixed_batch)
                    runner.launch(slot)  # the host-to-device copy of this layout
                    runner.wait(slot)
                    t = time_launches(runner, slot.groups, cfg.iters, cfg.warmup)
                    by_cost[cost] = {"tokens_per_s": slot.real_tokens / t, "launches": len(slot.groups)}
                uniform_batch = _mixed_batch(spec, b, None, cfg.items_per_request, rng)
                for name, lengths in (("uniform", None), ("mixed", cfg.mixed)):
                    batch = mixed_batch if lengths else uniform_batch
                    slot = runner.slots[0]
                    gather(layout, buckets, slot, batch)
                    runner.launch(slot)
                    runner.wait(slot)
                    before = dict(engine.counters)
                    t = time_launches(runner, slot.groups, cfg.iters, cfg.warmup)
                    res[name] = {
                        "seconds_per_batch": t,
                        "real_tokens": slot.real_tokens,
                        "padded_tokens": slot.padded_tokens,
                        "tokens_per_s": slot.real_tokens / t,
                        "launches": [[*g.bucket, g.rows] for g in slot.groups],
                        "graph_replays": engine.counters["replays"] - before["replays"],
                        "eager_launches": engine.counters["eager"] - before["eager"],
                    }
                packed = (
                    packed_mixed_row(
                        mixed_batch, max(mixed_seqs), v.precision, cfg.device_id, reference, cfg.iters, cfg.warmup
                    )
                    if cfg.model == "bert_tiny"
                    else None
                )
                unpadded = (
                    {
                        name: unpadded_row(batch, v.precision, cfg.device_id, reference, cfg.iters, cfg.warmup)
                        for name, batch in (
                            ("mixed", mixed_batch),
                            ("uniform", uniform_batch),
                            ("uniform_unmasked", _unmasked(uniform_batch)),
                        )
                    }
                    if cfg.model == "bert_tiny"
                    else None
                )
                mixed = {
                    "engine": v.label,
                    "batch": b,
                    "lengths": list(cfg.mixed),
                    "seq_buckets": list(mixed_seqs),
                    "uniform_seq": seq,
                    **res,
                    "mixed_length_token_ratio": res["mixed"]["tokens_per_s"] / res["uniform"]["tokens_per_s"],
                    "padding_waste": res["mixed"]["padded_tokens"] / res["mixed"]["real_tokens"] - 1,
                    "launch_cost_tokens": GPU_LAUNCH_COST_TOKENS,
                    "mixed_by_launch_cost_tokens": by_cost,
                    # not served: the same batch through the packed model (a measurement of packing)
                    "packed": packed,
                    "packed_token_ratio": None
                    if packed is None
                    else packed["tokens_per_s"] / res["uniform"]["tokens_per_s"],
                    # not served: the same batches through the unpadded model (FlashAttention varlen)
                    "unpadded": unpadded,
                    "unpadded_token_ratio": None
                    if unpadded is None
                    else unpadded["mixed"]["tokens_per_s"] / unpadded["uniform"]["tokens_per_s"],
                    "unpadded_mixed_over_served_uniform": None
                    if unpadded is None
                    else unpadded["mixed"]["tokens_per_s"] / res["uniform"]["tokens_per_s"],
                    "graphs": engine.graphs(),
                    "capture_all_s": capture_all_s,
                    "graph_memory_mb": engine.graph_memory_mb(),
                    "load_s": load_s,
                }
                LOGGER.info("mixed lengths: %s", json.dumps(mixed))
        finally:
            runner.close()
        if not cfg.variants:
            break
        torch.cuda.empty_cache()
    return rows_out, mixed
