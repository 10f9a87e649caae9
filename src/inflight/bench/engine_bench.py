"""Engine-level benchmark (no server): engine-only bound vs sync vs pipelined executor, one process.

For each batch size the same engine, buffers and graphs serve three measurements:

* **engine-only bound**: back-to-back replays of the bucket's CUDA graph on the compute stream,
  timed with CUDA events (no copies, no host work): the most the GPU can do;
* **sync executor**: gather, H2D, compute, D2H, wait, per batch (the stock-equivalent loop);
* **pipelined executor**: the ring of slots with a completion thread and sender threads whose
  ``send`` only hands the outputs back (no server round trip), so the executor itself is measured.

GPU temporal activity of the sync and pipelined windows comes from CUPTI activity records
(union of kernel and copy intervals over the window). Results go to ``results/engine_bench.json``.
"""

from __future__ import annotations

import json
import logging
import platform
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inflight.model_config import BackendParameters
from inflight.models.artifact import load_module
from inflight.models.registry import MODELS, get_model
from inflight.models.spec import ModelSpec
from inflight.runtime.assembly import assemble, capture_at_load
from inflight.runtime.batch import (
    GPU_LAUNCH_COST_TOKENS,
    Batch,
    Buckets,
    Group,
    Item,
    gather,
    outputs_for,
)
from inflight.runtime.engines.torch_engine import TorchEngine
from inflight.runtime.pipeline import PipelinedExecutor, SyncExecutor
from inflight.runtime.runners import CudaRunner
from inflight.variants import repository_spec

LOGGER = logging.getLogger(__name__)


class CountingSink:
    """A response sink that only counts (measures the executor, not the server's send path)."""

    def __init__(self) -> None:
        self.count = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.done = threading.Condition(self._lock)

    def send(self, handle: Any, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        """Count one response."""
        with self.done:
            self.count += 1
            if error is not None:
                self.errors.append(error)
            self.done.notify_all()

    def wait_for(self, n: int, timeout_s: float = 120.0) -> None:
        """Block until ``n`` responses arrived.

        Raises:
            TimeoutError: when they do not.
        """
        deadline = time.monotonic() + timeout_s
        with self.done:
            while self.count < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.count}/{n} responses after {timeout_s} s")
                self.done.wait(left)


@dataclass
class BenchConfig:
    """What to measure.

    Attributes:
        model: Registry model name.
        artifact: The ``.pt2`` file.
        batches: Batch sizes (items per batch).
        seq_len: Sequence length (variable-length models).
        items_per_request: Items per request; a batch holds several requests, as the dynamic batcher forms it.
        iters: Batches per measurement.
        warmup: Batches before each measurement.
        slots: Ring size of the pipelined executor.
        response_threads: Sender threads of the pipelined executor.
        precision: fp16 or fp32.
        device_id: GPU.
        wait_mode: blocking or poll (completion wait).
    """

    model: str = "bert_tiny"
    artifact: Path = Path("model_repository/bert_tiny_inflight/1/model.pt2")
    batches: Sequence[int] = (32, 128, 512, 2048)
    seq_len: int = 64
    items_per_request: int = 50
    iters: int = 200
    warmup: int = 20
    slots: int = 4
    response_threads: int = 4
    precision: str = "fp16"
    device_id: int = 0
    wait_mode: str = "blocking"
    variants: bool = True
    mixed: tuple[int, int] = (16, 128)


@dataclass(frozen=True)
class Variant:
    """One engine the bench compares.

    Attributes:
        label: Its name in the JSON (``engine`` key of each row).
        compile: ``none``, ``inductor`` or ``max-autotune``.
        precision: ``fp16``, ``bf16`` or ``fp32``.
        module: ``make_module`` options to export a module from (None: the repository's artifact).
    """

    label: str
    compile: str
    precision: str
    module: tuple[tuple[str, Any], ...] | None = None


def variants_for(model: str, precision: str, spec: ModelSpec | None = None) -> list[Variant]:
    """The engines compared for ``model``: the served one first, then the others.

    bert_tiny compares its rewrites and kernels one by one; a head compares the served engine
    (its rewrite, compiled as ``compile=auto`` compiles it on a GPU) with the other compile mode
    and with the published head as the engine ran it before (inductor) and eager.
    """
    if model == "bert_tiny":
        full = (("cls_only", False), ("kernels", False))
        return [
            Variant(f"inductor + Triton kernels, CLS-only last layer (served), {precision}", "inductor", precision),
            Variant(f"eager, unmodified model (the engine before), {precision}", "none", precision, full),
            Variant(f"inductor, unmodified model, {precision}", "inductor", precision, full),
            Variant(
                f"inductor, CLS-only last layer, unfused ops (served before the kernels), {precision}",
                "inductor",
                precision,
                (("kernels", False),),
            ),
            Variant("inductor + Triton kernels, CLS-only last layer (served), bf16", "inductor", "bf16"),
        ]
    spec = spec if spec is not None else get_model(model)
    served, other = spec.gpu_compile, "none" if spec.gpu_compile == "inductor" else "inductor"
    name = {"inductor": "inductor", "none": "eager"}
    rewrite = "bias+ReLU in the GEMM epilogue, " if model == "linear_head" else ""
    # without a rewrite, the engine before is the served artifact under inductor (compile=auto's
    # choice on a GPU before the heads were measured)
    before = {c: "" if spec.reference_options or c != "inductor" else ", the engine before" for c in (served, other)}
    out = [
        Variant(f"{name[served]}, {rewrite}served artifact{before[served]} (served), {precision}", served, precision),
        Variant(f"{name[other]}, {rewrite}served artifact{before[other]}, {precision}", other, precision),
    ]
    if spec.reference_options:
        ref = tuple(sorted(spec.reference_options.items()))
        out += [
            Variant(f"inductor, published head (the engine before), {precision}", "inductor", precision, ref),
            Variant(f"eager, published head, {precision}", "none", precision, ref),
        ]
    return out


def _batch_pool(
    spec: Any, rows: int, seq: int | None, per_request: int, n: int, rng: np.random.Generator
) -> list[Batch]:
    pool = []
    for _ in range(n):
        items = []
        left = rows
        k = 0
        while left > 0:
            c = min(per_request, left)
            x = spec.example_inputs(c, seq_len=seq, rng=rng)
            items.append(Item(inputs=x, count=c, seq=seq, handle=k))
            left -= c
            k += 1
        pool.append(Batch(items))
    return pool


def _gpu_window() -> Any:
    try:
        from inflight.profiling.cupti_live import CuptiWindow

        return CuptiWindow()
    except Exception as e:  # CUPTI missing: figures are reported as None, not invented
        LOGGER.warning("CUPTI unavailable (%s); GPU activity will be reported as null", e)
        return None


def _artifact(cfg: BenchConfig, v: Variant, tmp: Path) -> Path:
    if v.module is None:
        return cfg.artifact
    from inflight.build.export import export_torch

    spec = _spec(cfg)
    path = tmp / ("-".join(f"{k}={val}" for k, val in v.module) + ".pt2")
    if not path.is_file():
        export_torch(spec, spec.build_module(0, **dict(v.module)), path)
    return path


def _spec(cfg: BenchConfig) -> ModelSpec:
    """The benchmarked model: built in, or what the repository holding the artifact says."""
    return repository_spec(cfg.artifact.parents[2], cfg.model)


def _group(rows: int, seq: int | None, spec: Any) -> Group:
    return Group((rows, seq), rows, 0, {t.name: 0 for t in spec.inputs}, {t.name: 0 for t in spec.outputs})


def _time_launches(runner: CudaRunner, groups: Sequence[Group], iters: int, warmup: int) -> float:
    """Seconds per pass of ``groups`` launched back to back on the compute stream (CUDA events)."""
    from inflight.runtime import cuda

    engine, stream = runner.engine, runner.compute
    for _ in range(warmup):
        for g in groups:
            engine.enqueue(0, g, stream.ptr)
    start = cuda.Event(cuda.EventOptions(enable_timing=True))
    end = cuda.Event(cuda.EventOptions(enable_timing=True))
    stream.record(start)
    for _ in range(iters):
        for g in groups:
            engine.enqueue(0, g, stream.ptr)
    stream.record(end)
    end.synchronize()
    seconds = end.elapsed_ms(start) / 1e3 / iters
    start.close()
    end.close()
    return seconds


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


def _fill(runner: CudaRunner, spec: Any, seq: int | None) -> None:
    """Copy valid inputs into every element of the slot's device buffers (launch and wait once)."""
    slot = runner.slots[0]
    rows = runner.layout.max_items
    x = spec.example_inputs(rows, seq_len=seq, rng=np.random.default_rng(5))
    gather(runner.layout, Buckets(runner.buckets.batch, runner.buckets.seq), slot, Batch([Item(x, rows, seq, 0)]))
    runner.launch(slot)
    runner.wait(slot)


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


#: Sequences one packed row may hold (query slots per row of the packed model).
PACKED_PER_ROW = 16


def _graph_time(
    module: Any, arrays: tuple[np.ndarray, ...], precision: str, device_id: int, iters: int, warmup: int
) -> tuple[float, float, Any]:
    """Compile ``module`` in ``precision``, capture one call in a CUDA graph and time its replays.

    The module is compiled with inductor (dynamic shapes) and called on ``arrays`` copied to the
    GPU. Returns (seconds per replay, compile and capture seconds, the captured output tensor).
    """
    import torch

    dev = torch.device(f"cuda:{device_id}")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    compiled = torch.compile(module.to(dev).to(dtype), dynamic=True)
    static = [torch.from_numpy(a).to(dev) for a in arrays]
    stream = torch.cuda.Stream(dev)
    t1 = time.perf_counter()
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(2):
            compiled(*static)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph, stream=stream):
        out = compiled(*static)
    compile_s = time.perf_counter() - t1
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            graph.replay()
        start.record(stream)
        for _ in range(iters):
            graph.replay()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters, compile_s, out


def _max_error_per_sequence(got: np.ndarray, ids: list[np.ndarray], masks: list[np.ndarray], reference: Any) -> float:
    """Largest ``|got[i] - reference(sequence i alone)|`` over the first 64 sequences."""
    import torch

    err = 0.0
    with torch.inference_mode():
        for i in range(min(64, len(ids))):
            want = reference(torch.from_numpy(ids[i][None]), torch.from_numpy(masks[i][None])).numpy()[0]
            err = max(err, float(np.abs(got[i] - want).max()))
    return err


def unpadded_row(
    batch: Batch, precision: str, device_id: int, reference: Any, iters: int, warmup: int
) -> dict[str, Any]:
    """A batch through the unpadded model (``make_unpadded_module``), replayed from a graph.

    Every sequence's masked tokens are left out and the rest laid end to end
    (:func:`inflight.models.packing.unpad`), attention is FlashAttention's variable-length kernel.
    Compiled from the module as :func:`packed_mixed_row` does. Returns the time per batch, the
    tokens of the requests (sequence lengths, masked tokens included: what the served rows count
    as real tokens, so ``tokens_per_s`` compares with theirs) and the tokens computed (the unmasked
    ones), the host time to unpad, and the largest error against the fp32 CPU model over the first
    64 sequences.
    """
    from inflight.models.bert import make_unpadded_module
    from inflight.models.packing import unpad

    ids = [it.inputs["input_ids"][j] for it in batch.items for j in range(it.count)]
    masks = [it.inputs["attention_mask"][j] for it in batch.items for j in range(it.count)]
    t0 = time.perf_counter()
    u = unpad(ids, masks)
    unpad_s = time.perf_counter() - t0
    max_len = max(len(x) for x in ids)
    module = make_unpadded_module(0, max_len=max_len)
    seconds, compile_s, out = _graph_time(module, u.arrays(), precision, device_id, iters, warmup)
    got = out.float().cpu().numpy()
    err = _max_error_per_sequence(got, ids, masks, reference)
    return {
        "seconds_per_batch": seconds,
        "real_tokens": u.padded_tokens,
        "computed_tokens": u.tokens,
        "tokens_per_s": u.padded_tokens / seconds,
        "sequences": len(ids),
        "max_len": max_len,
        "unpad_s": unpad_s,
        "compile_and_capture_s": compile_s,
        "max_abs_error_vs_fp32_cpu": err,
    }


def packed_mixed_row(
    batch: Batch, row_len: int, precision: str, device_id: int, reference: Any, iters: int, warmup: int
) -> dict[str, Any]:
    """The mixed-length batch packed into rows of ``row_len`` (``make_packed_module``), replayed from a graph.

    The packed module is compiled from the module (inductor, dynamic shapes) rather than from the
    repository's artifact, cast to ``precision`` as the served engine casts its module, and its
    step captured in one CUDA graph on static inputs. Returns the time per batch, real and
    computed tokens, rows, the host time to pack, and the largest error against the fp32 CPU model
    over the first 64 sequences.
    """
    from inflight.models.bert import make_packed_module
    from inflight.models.packing import pack

    ids = [it.inputs["input_ids"][j] for it in batch.items for j in range(it.count)]
    masks = [it.inputs["attention_mask"][j] for it in batch.items for j in range(it.count)]
    t0 = time.perf_counter()
    packed = pack(ids, masks, row_len, PACKED_PER_ROW)
    pack_s = time.perf_counter() - t0
    module = make_packed_module(0)
    seconds, compile_s, out = _graph_time(module, packed.arrays(), precision, device_id, iters, warmup)
    got = packed.unpack(out.float().cpu().numpy())
    err = _max_error_per_sequence(got, ids, masks, reference)
    return {
        "seconds_per_batch": seconds,
        "real_tokens": packed.real_tokens,
        "padded_tokens": packed.padded_tokens,
        "tokens_per_s": packed.real_tokens / seconds,
        "rows": packed.rows,
        "row_len": row_len,
        "per_row": PACKED_PER_ROW,
        "padding_waste": packed.padded_tokens / packed.real_tokens - 1,
        "pack_s": pack_s,
        "compile_and_capture_s": compile_s,
        "max_abs_error_vs_fp32_cpu": err,
    }


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
        t = _time_launches(runner, slot.groups, cfg.iters, cfg.warmup)
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

    spec = _spec(cfg)
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
            _fill(runner, spec, mixed_seqs[-1] if mixed_seqs else None)
            for b in cfg.batches:
                t = _time_launches(runner, [_group(b, seq, spec)], cfg.iters, cfg.warmup)
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
                    t = _time_launches(runner, slot.groups, cfg.iters, cfg.warmup)
                    by_cost[cost] = {"tokens_per_s": slot.real_tokens / t, "launches": len(slot.groups)}
                uniform_batch = _mixed_batch(spec, b, None, cfg.items_per_request, rng)
                for name, lengths in (("uniform", None), ("mixed", cfg.mixed)):
                    batch = mixed_batch if lengths else uniform_batch
                    slot = runner.slots[0]
                    gather(layout, buckets, slot, batch)
                    runner.launch(slot)
                    runner.wait(slot)
                    before = dict(engine.counters)
                    t = _time_launches(runner, slot.groups, cfg.iters, cfg.warmup)
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


def run(cfg: BenchConfig) -> dict[str, Any]:
    """Run every measurement and return the result document."""
    import torch

    from inflight.runtime import cuda

    spec = _spec(cfg)
    seq = cfg.seq_len if spec.variable_seq else None
    max_rows = max(cfg.batches)
    variant_rows: list[dict[str, Any]] = []
    mixed: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="inflight-bench-") as tmp:
        variant_rows, mixed = bench_variants(cfg, Path(tmp))
    served = variants_for(cfg.model, cfg.precision, spec)[0].label
    # the served engine padded at the measured batch sizes, one runner per executor (the sync
    # executor gets 1 slot, the pipelined one `slots`), each with its own engine as two instances have
    params = BackendParameters(
        engine="torch",
        precision=cfg.precision,  # type: ignore[arg-type]
        max_graphs=512,
        unpad=False,
        batch_buckets=tuple(sorted(set(cfg.batches))),
        seq_buckets=(seq,) if seq else BackendParameters().seq_buckets,
        warmup_seq_len=seq or BackendParameters().warmup_seq_len,
        capture_at_load=False,
        completion_wait=cfg.wait_mode,  # type: ignore[arg-type]
        artifact=cfg.artifact.name,
    )
    sync_parts, pipe_parts = (
        assemble(params, spec, max_batch=max_rows, version_dir=cfg.artifact.parent, device_id=cfg.device_id)
        for _ in range(2)
    )
    sync_runner, pipe_runner = sync_parts.runner, pipe_parts.runner
    engine, pipe_engine = sync_parts.engine, pipe_parts.engine
    assert isinstance(sync_runner, CudaRunner) and isinstance(pipe_runner, CudaRunner)
    assert isinstance(engine, TorchEngine) and isinstance(pipe_engine, TorchEngine)
    sink, sync_sink = CountingSink(), CountingSink()
    rows_out: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)

    sync_ex = SyncExecutor(sync_runner)
    pipe_ex = PipelinedExecutor(pipe_runner, sink, slots=cfg.slots, response_threads=cfg.response_threads)
    buckets = sync_parts.buckets
    t0 = time.perf_counter()
    capture_at_load(sync_parts, params)
    capture_at_load(pipe_parts, params)
    _fill(sync_runner, spec, seq)  # the engine-only bound below reads the slot's device buffers
    LOGGER.info("captured %d + %d graphs in %.1f s", engine.graphs(), pipe_engine.graphs(), time.perf_counter() - t0)

    for rows in cfg.batches:
        pool = _batch_pool(spec, rows, seq, cfg.items_per_request, 8, rng)
        bucket = buckets.pick(rows, seq)

        # engine-only bound: graph replays back to back on the compute stream
        group = _group(bucket[0], bucket[1], spec)
        bound_s = _time_launches(sync_runner, [group], cfg.iters, cfg.warmup) * cfg.iters
        # the bound's own temporal activity: gaps between the kernels inside one graph replay
        bound_act = None
        w = _gpu_window()
        if w is not None:
            with w:
                for _ in range(cfg.iters):
                    engine.enqueue(0, group, sync_runner.compute.ptr)
                sync_runner.compute.synchronize()
            bound_act = w.gpu_activity()

        def sync_pass(pool: list[Batch] = pool) -> float:
            t = time.perf_counter()
            for i in range(cfg.iters):
                sync_ex.run(pool[i % len(pool)], sync_sink)
            return time.perf_counter() - t

        def pipe_pass(pool: list[Batch] = pool) -> float:
            expect = sink.count + sum(len(pool[i % len(pool)].items) for i in range(cfg.iters))
            t = time.perf_counter()
            for i in range(cfg.iters):
                pipe_ex.submit(pool[i % len(pool)])
            sink.wait_for(expect)
            return time.perf_counter() - t

        for i in range(cfg.warmup):
            sync_ex.run(pool[i % len(pool)], sync_sink)
        sync_s = sync_pass()
        pipe_s: dict[str, float] = {}
        stats_before = pipe_ex.stats.snapshot()
        for mode in ("blocking", "poll"):
            pipe_runner.wait_mode = mode
            pipe_s[mode] = pipe_pass()  # the first pass also warms up
            pipe_s[mode] = pipe_pass()
        best = min(pipe_s, key=lambda m: pipe_s[m])
        pipe_runner.wait_mode = best
        stats_after = pipe_ex.stats.snapshot()
        # instrumented passes: GPU activity and sync share from CUPTI (tracing costs some throughput)
        sync_act = sync_share = pipe_act = pipe_share = None
        sync_traced_s = pipe_traced_s = None
        w = _gpu_window()
        if w is not None:
            with w:
                sync_traced_s = sync_pass()
            sync_act, sync_share = w.gpu_activity(), w.sync_share()
            w = _gpu_window()
            with w:
                pipe_traced_s = pipe_pass()
            pipe_act, pipe_share = w.gpu_activity(), w.sync_share()
        bound_items_s = rows * cfg.iters / bound_s
        sync_items_s = rows * cfg.iters / sync_s
        pipe_items_s = rows * cfg.iters / pipe_s[best]
        batches = stats_after["batches"] - stats_before["batches"]
        depth = {
            d: n - stats_before["depth_launches"].get(d, 0)
            for d, n in stats_after["depth_launches"].items()
            if n - stats_before["depth_launches"].get(d, 0)
        }
        row: dict[str, Any] = {
            "engine": f"{served}, with the executors",
            "engine_us_per_batch": bound_s * 1e6 / cfg.iters,
            "floor_us_per_batch": next(
                (r["floor_us_per_batch"] for r in variant_rows if r["engine"] == served and r["batch"] == rows), None
            ),
            "batch": rows,
            "bucket": bucket[0],
            "requests_per_batch": len(pool[0].items),
            "engine_bound_items_s": bound_items_s,
            "sync_items_s": sync_items_s,
            "pipelined_items_s": pipe_items_s,
            "pipelined_fraction_of_bound": pipe_items_s / bound_items_s,
            "sync_fraction_of_bound": sync_items_s / bound_items_s,
            "pipelined_wait_mode": best,
            "pipelined_items_s_by_wait_mode": {m: rows * cfg.iters / v for m, v in pipe_s.items()},
            "engine_ms_per_batch": bound_s * 1e3 / cfg.iters,
            "sync_ms_per_batch": sync_s * 1e3 / cfg.iters,
            "pipelined_ms_per_batch": pipe_s[best] * 1e3 / cfg.iters,
            "engine_bound_gpu_activity": bound_act,
            "sync_gpu_activity": sync_act,
            "pipelined_gpu_activity": pipe_act,
            "sync_sync_share": sync_share,
            "pipelined_sync_share": pipe_share,
            "traced_over_untraced_throughput": {
                "sync": None if sync_traced_s is None else sync_s / sync_traced_s,
                "pipelined": None if pipe_traced_s is None else pipe_s[best] / pipe_traced_s,
            },
            "pipelined_launch_depth": depth,
            "pipelined_slot_waits_per_batch": (stats_after["slot_waits"] - stats_before["slot_waits"]) / batches,
            "pipelined_gather_us_per_batch": (stats_after["gather_s"] - stats_before["gather_s"]) * 1e6 / batches,
            "pipelined_launch_us_per_batch": (stats_after["launch_s"] - stats_before["launch_s"]) * 1e6 / batches,
        }
        LOGGER.info("%s", json.dumps(row))
        rows_out.append(row)

    assert not sink.errors and not sync_sink.errors, (sink.errors + sync_sink.errors)[:3]
    from inflight.bench.floor import peak_for

    peak = peak_for(cuda.device_name(cfg.device_id))
    pipe_stats = pipe_ex.stats.snapshot()
    pipe_ex.close()
    sync_ex.close()
    return {
        "kind": "engine_bench",
        "device": cuda.device_name(cfg.device_id),
        "driver": _driver(),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
        "rows": rows_out + variant_rows,
        "mixed_length": mixed,
        "mixed_length_token_ratio": mixed.get("mixed_length_token_ratio"),
        "peak": None if peak is None else peak.name,
        "pipelined_stats": pipe_stats,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _driver() -> str:
    import subprocess

    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except Exception:
        return "unknown"


def write(doc: Mapping[str, Any], path: Path) -> Path:
    """Write the result JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
