"""Engine-level benchmark (no server): engine-only bound vs sync vs pipelined executor, one process.

For each batch size the same engine, buffers and graphs serve three measurements:

* **engine-only bound**: back-to-back replays of the bucket's CUDA graph on the compute stream,
  timed with CUDA events (no copies, no host work): the most the GPU can do;
* **sync executor**: gather, H2D, compute, D2H, wait, per batch (the stock-equivalent loop);
* **pipelined executor**: the ring of slots with a completion thread and sender threads whose
  ``send`` only hands the outputs back (no server round trip), so the executor itself is measured.

GPU temporal activity of the sync and pipelined windows comes from CUPTI activity records
(union of kernel and copy intervals over the window). Every engine the bench compares is timed
first (:mod:`~inflight.bench.variant_bench`). Results go to ``results/engine_bench.json``.
"""

from __future__ import annotations

import json
import logging
import platform
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inflight.bench.config import BenchConfig, bench_spec, variants_for
from inflight.bench.launches import fill_slot, launch_group, time_launches
from inflight.bench.variant_bench import bench_variants
from inflight.model_config import BackendParameters
from inflight.runtime.assembly import assemble, capture_at_load
from inflight.runtime.batch import Batch, Item
from inflight.runtime.engines.torch_engine import TorchEngine
from inflight.runtime.pipeline import PipelinedExecutor, SyncExecutor
from inflight.runtime.runners import CudaRunner

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


def run(cfg: BenchConfig) -> dict[str, Any]:
    """Run every measurement and return the result document."""
    import torch

    from inflight.runtime import cuda

    spec = bench_spec(cfg)
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
    fill_slot(sync_runner, spec, seq)  # the engine-only bound below reads the slot's device buffers
    LOGGER.info("captured %d + %d graphs in %.1f s", engine.graphs(), pipe_engine.graphs(), time.perf_counter() - t0)

    for rows in cfg.batches:
        pool = _batch_pool(spec, rows, seq, cfg.items_per_request, 8, rng)
        bucket = buckets.pick(rows, seq)

        # engine-only bound: graph replays back to back on the compute stream
        group = launch_group(bucket[0], bucket[1], spec)
        bound_s = time_launches(sync_runner, [group], cfg.iters, cfg.warmup) * cfg.iters
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
