"""The executors on a real GPU, in-process (no server): every bucket, sync-free issue path, clean finalize."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import Collect, in_band

from inflight.models import MODELS
from inflight.models.reference import error_bound, reference_outputs, relative_error
from inflight.runtime.batch import GPU_LAUNCH_COST_TOKENS, Batch, Buckets, Item, Layout, pow2_buckets

pytestmark = pytest.mark.gpu


def _make(repository: Path, model: str, slots: int, *, max_batch: int = 2048, graphs: bool = True) -> tuple[Any, Any]:
    from inflight.runtime.engines.torch_engine import TorchEngine
    from inflight.runtime.runners import CudaRunner

    spec = MODELS[model]
    seq_buckets = (16, 32, 64, 128) if spec.variable_seq else None
    layout = Layout(spec, max_batch, seq_buckets[-1] if seq_buckets else None)
    engine = TorchEngine(repository / f"{model}_inflight" / "1" / "model.pt2", spec, device_id=0, cuda_graphs=graphs)
    runner = CudaRunner(
        engine, layout, Buckets(pow2_buckets(max_batch), seq_buckets, GPU_LAUNCH_COST_TOKENS), device_id=0
    )
    return runner, spec


def _batches(spec: Any, sizes: list[int], seqs: list[int | None], rng: np.random.Generator) -> list[Batch]:
    out, k = [], 0
    for rows, seq in zip(sizes, seqs, strict=True):
        items, left = [], rows
        while left:
            c = int(min(left, rng.integers(1, 60)))
            items.append(Item(inputs=spec.example_inputs(c, seq_len=seq, rng=rng), count=c, seq=seq, handle=k))
            k += 1
            left -= c
        out.append(Batch(items))
    return out


#: largest batch checked per model: seqlen_head's CPU reference costs 128 x 20 GEMM rows per item, so
#: it is checked on the buckets up to 128 (its larger buckets run in the engine bench)
_CHECKED_UP_TO = {"seqlen_head": 128}


@pytest.mark.parametrize("model", ["bert_tiny", "linear_head", "stacked_head", "seqlen_head"])
def test_pipelined_every_bucket_matches_reference(repository: Path, model: str) -> None:
    from inflight.runtime.pipeline import PipelinedExecutor

    runner, spec = _make(repository, model, 4)
    sink = Collect()
    ex = PipelinedExecutor(runner, sink, slots=4, response_threads=4)
    seq_warm = 64 if spec.variable_seq else None
    runner.warmup((seq_warm,))
    rng = np.random.default_rng(7)
    # sizes straddling every bucket edge, 1..2048, and sequence lengths that pad within their bucket
    top = _CHECKED_UP_TO.get(model, 2048)
    sizes = sorted({1, 2, 3, *(b + d for b in pow2_buckets(2048) for d in (-1, 0, 1) if 1 <= b + d <= top)})
    seqs: list[int | None] = [int(rng.choice([7, 16, 33, 64, 100])) if spec.variable_seq else None for _ in sizes]
    batches = _batches(spec, sizes, seqs, rng)
    for b in batches:
        ex.submit(b)
    n = sum(len(b.items) for b in batches)
    sink.wait(n)
    assert ex.close(30)
    assert ex.stats.max_depth > 1
    for b in batches:
        for item in b.items:
            out, err = sink.got[item.handle]
            assert err is None, err
            y = out[spec.outputs[0].name]  # type: ignore[index]
            assert y.shape[0] == item.count, "padding leaked into a response"
            ref = reference_outputs(repository, model, item.inputs)  # type: ignore[arg-type]
            assert relative_error(y, ref) <= error_bound(True), (b.rows, item.seq)


def test_sync_executor_matches_reference(repository: Path) -> None:
    from inflight.runtime.pipeline import SyncExecutor

    runner, spec = _make(repository, "bert_tiny", 1)
    ex = SyncExecutor(runner)
    runner.warmup((64,))
    rng = np.random.default_rng(8)
    for b in _batches(spec, [1, 33, 500, 2048], [64, 16, 128, 64], rng):
        outs = in_band(ex, b)
        for item, out in zip(b.items, outs, strict=True):
            ref = reference_outputs(repository, "bert_tiny", item.inputs)  # type: ignore[arg-type]
            assert relative_error(out["cls"], ref) <= error_bound(True)
    ex.close()


def _mixed(spec: Any, rows: int, rng: np.random.Generator, k0: int) -> Batch:
    items, left, k = [], rows, k0
    while left:
        c = min(left, 50)
        seq = int(rng.integers(16, 129))
        items.append(Item(inputs=spec.example_inputs(c, seq_len=seq, rng=rng), count=c, seq=seq, handle=k))
        k += 1
        left -= c
    return Batch(items)


def test_mixed_lengths_are_graph_replays_and_match_reference(repository: Path) -> None:
    """A batch of lengths uniform over 16..128: one launch per (merged) sequence bucket, every one a
    graph replay once the buckets are captured; a bucket first used after load runs eagerly once,
    is captured, and replays from then on."""
    from inflight.runtime.pipeline import SyncExecutor

    runner, spec = _make(repository, "bert_tiny", 1)
    ex = SyncExecutor(runner)
    runner.warmup((64,))  # only seq 64 at load: the others are captured on first use
    rng = np.random.default_rng(11)
    first = _mixed(spec, 2048, rng, 0)
    outs = in_band(ex, first)
    eager_first = ex.stats.eager_launches
    assert ex.stats.mixed_length_batches == 1 and ex.stats.launches > 1
    assert eager_first >= 1, "buckets other than seq 64 were not captured at load, so some launch runs eagerly"
    assert runner.engine.counters["lazy_captures"] == eager_first
    for item, out in zip(first.items, outs, strict=True):
        ref = reference_outputs(repository, "bert_tiny", item.inputs)
        assert relative_error(out["cls"], ref) <= error_bound(True), item.seq
    # the same composition again: every launch replays a graph
    replays_before = ex.stats.graph_replays
    outs = in_band(ex, first)
    assert ex.stats.eager_launches == eager_first
    assert ex.stats.graph_replays - replays_before == len(runner.slots[0].groups)
    assert ex.stats.padded_tokens > ex.stats.real_tokens
    for item, out in zip(first.items, outs, strict=True):
        ref = reference_outputs(repository, "bert_tiny", item.inputs)
        assert relative_error(out["cls"], ref) <= error_bound(True), item.seq
    ex.close()


def test_capture_at_load_leaves_no_eager_launch(repository: Path) -> None:
    from inflight.runtime.pipeline import SyncExecutor

    runner, spec = _make(repository, "bert_tiny", 1)
    ex = SyncExecutor(runner)
    runner.warmup((64, 16, 32, 128))
    graphs = runner.engine.graphs()
    assert graphs == len(pow2_buckets(2048)) * 4
    for i in range(3):
        in_band(ex, _mixed(spec, 1000 + 300 * i, np.random.default_rng(20 + i), 0))
    assert ex.stats.eager_launches == 0 and ex.stats.graph_replays == ex.stats.launches > 3
    assert runner.engine.graph_memory_mb() > 0
    ex.close()


def test_execute_thread_makes_no_synchronize_calls(repository: Path) -> None:
    """CUPTI runtime records by thread: the issuing thread never synchronizes; the completion side does."""
    from inflight.profiling.cupti_hub import import_cupti
    from inflight.profiling.cupti_live import CuptiWindow
    from inflight.tool_errors import CuptiUnavailableError

    try:
        import_cupti()
    except CuptiUnavailableError as e:
        pytest.skip(f"this test reads CUPTI runtime records: {e}")
    from inflight.runtime.pipeline import PipelinedExecutor

    runner, spec = _make(repository, "bert_tiny", 4)
    sink = Collect()
    ex = PipelinedExecutor(runner, sink, slots=4, response_threads=4)
    runner.warmup((64,))
    batches = _batches(spec, [512] * 60, [64] * 60, np.random.default_rng(9))
    issuer: dict[str, int] = {}

    def issue() -> None:
        issuer["tid"] = threading.get_native_id()
        for b in batches:
            ex.submit(b)

    with CuptiWindow() as w:
        t = threading.Thread(target=issue, name="execute")
        t.start()
        t.join()
        sink.wait(sum(len(b.items) for b in batches))
    ex.close(30)
    calls = w.sync_calls_by_thread()
    assert calls.get(issuer["tid"], 0) == 0, f"the issuing thread synchronized: {calls}"
    assert sum(calls.values()) > 0, "no synchronize calls seen at all: the measurement would prove nothing"
    assert ex.stats.max_depth > 1


def test_repeated_create_and_close_does_not_grow_gpu_memory(repository: Path) -> None:
    """Each cycle builds an engine, slots and graphs, serves, closes; memory must not grow per cycle.

    Memory that belongs to the process, not to an executor, may appear once and stay: CUDA module
    code loaded lazily, and torch's cuBLAS workspaces, which it caches per (handle, stream) and
    which a new executor's new streams can add. H200 runs kept 20 MiB once, in cycle 2 of 3 in one
    run and in cycle 3 of 4 in another, and nothing in the other cycles. A leak of what an executor
    owns repeats every cycle (one executor holds hundreds of MiB), so after the first cycle: at
    least one cycle must keep nothing (within 4 MiB), no cycle may keep 64 MiB, and five cycles
    together must keep less than 64 MiB.
    """
    import torch

    from inflight.runtime import cuda
    from inflight.runtime.pipeline import PipelinedExecutor

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free: list[int] = []
    held: list[float] = []
    clear_cublas = getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)
    for cycle in range(6):
        before, _ = cuda.mem_info()
        runner, spec = _make(repository, "bert_tiny", 4)
        sink = Collect()
        ex = PipelinedExecutor(runner, sink, slots=4, response_threads=2)
        runner.warmup((64,))
        batches = _batches(spec, [2048, 100, 7], [64, 64, 128], np.random.default_rng(10 + cycle))
        for b in batches:
            ex.submit(b)
        sink.wait(sum(len(b.items) for b in batches))
        during, _ = cuda.mem_info()
        assert ex.close(30)
        clear_cublas()
        torch.cuda.empty_cache()
        after, _ = cuda.mem_info()
        free.append(after)
        held.append((before - during) / 2**20)
        print(f"cycle {cycle}: held {held[-1]:.0f} MiB, {(before - after) / 2**20:.1f} MiB kept after close")
    assert min(held) > 10
    kept = [(free[i - 1] - free[i]) / 2**20 for i in range(1, len(free))]  # per cycle, after the first
    detail = f"MiB kept per cycle after the first: {[round(k, 1) for k in kept]} (free after each: {free})"
    assert min(kept) < 4, f"every cycle kept GPU memory: a per-cycle leak; {detail}"
    assert max(kept) < 64 and sum(kept) < 64, f"GPU memory grew beyond one-time process allocations; {detail}"
