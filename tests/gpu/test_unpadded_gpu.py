"""Unpadded launches on a real GPU, in-process: outputs against the reference, graph replays, the choice.

The Torch engine with ``unpad`` and token buckets, as the server builds it for bert_tiny: a batch of
any mix of lengths is one launch; a launch with much padding leaves its masked tokens out on the
device (FlashAttention's variable-length kernel) and replays the graph of its token bucket.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import Collect, in_band

from inflight.models import MODELS
from inflight.models.reference import error_bound, reference_outputs, relative_error
from inflight.runtime.batch import GPU_LAUNCH_COST_TOKENS, Batch, Buckets, Item, Layout, pow2_buckets, token_buckets

pytestmark = pytest.mark.gpu

SEQS = (16, 32, 64, 128)


def _make(repository: Path, graph_tokens: int = 0) -> Any:
    from inflight.runtime.engines.torch_engine import TorchEngine
    from inflight.runtime.runners import CudaRunner

    spec = MODELS["bert_tiny"]
    layout = Layout(spec, 2048, SEQS[-1])
    engine = TorchEngine(
        repository / "bert_tiny_inflight" / "1" / "model.pt2", spec, device_id=0, unpad=True, graph_tokens=graph_tokens
    )
    assert engine.unpads, engine.describe()
    limit = min(2048 * SEQS[-1], graph_tokens or 2048 * SEQS[-1])
    buckets = Buckets(
        pow2_buckets(2048), SEQS, GPU_LAUNCH_COST_TOKENS, tokens=token_buckets(limit), exact_from=graph_tokens
    )
    return CudaRunner(engine, layout, buckets, device_id=0)


def _batch(rows: int, lengths: tuple[int, int], rng: np.random.Generator, first: int = 0) -> Batch:
    spec, items, left, k = MODELS["bert_tiny"], [], rows, first
    while left:
        c = int(min(left, rng.integers(1, 60)))
        s = int(rng.integers(lengths[0], lengths[1] + 1))
        items.append(Item(inputs=spec.example_inputs(c, seq_len=s, rng=rng), count=c, seq=s, handle=k))
        left -= c
        k += 1
    return Batch(items)


def _check(repository: Path, batch: Batch, outs: list[dict[str, np.ndarray]]) -> None:
    for item, out in zip(batch.items, outs, strict=True):
        assert out["cls"].shape[0] == item.count, "padding leaked into a response"
        ref = reference_outputs(repository, "bert_tiny", item.inputs)
        assert relative_error(out["cls"], ref) <= error_bound(True), (item.seq, item.count)


def test_mixed_lengths_run_as_one_unpadded_launch_replayed_from_a_graph(repository: Path) -> None:
    from inflight.runtime.pipeline import SyncExecutor

    runner = _make(repository)
    ex = SyncExecutor(runner)
    runner.warmup((64,))
    graphs = runner.warmup_unpadded(64)
    assert graphs > len(pow2_buckets(2048)), "no unpadded graph captured at load"
    rng = np.random.default_rng(3)
    mixed = _batch(2048, (16, 128), rng)
    outs = in_band(ex, mixed)
    assert ex.stats.launches == 1 and ex.stats.unpadded_launches == 1 and ex.stats.mixed_length_batches == 1
    assert ex.stats.padded_tokens < ex.stats.real_tokens  # the masked tails were left out
    _check(repository, mixed, outs)
    eager = ex.stats.eager_launches  # seq 128's token bucket: captured on its first use
    outs = in_band(ex, mixed)
    assert ex.stats.eager_launches == eager and ex.stats.graph_replays >= 1
    _check(repository, mixed, outs)
    # length 64, three quarters of every sequence masked: unpadded from a graph captured at load
    uniform = _batch(2000, (64, 64), rng, 10_000)
    for it in uniform.items:
        it.inputs["attention_mask"][:, 16:] = 0
        it.inputs["input_ids"][:, 16:] = 0
    before = ex.stats.eager_launches
    _check(repository, uniform, in_band(ex, uniform))
    assert ex.stats.eager_launches == before and ex.stats.unpadded_launches == 3
    ex.close()


def test_small_or_unmasked_launches_run_padded_and_every_answer_matches(repository: Path) -> None:
    from inflight.runtime.pipeline import PipelinedExecutor

    runner = _make(repository)
    sink = Collect()
    ex = PipelinedExecutor(runner, sink, slots=4, response_threads=4)
    runner.warmup((64,))
    runner.warmup_unpadded(64)
    rng = np.random.default_rng(5)
    full = _batch(2000, (64, 64), rng)
    for it in full.items:  # every token kept: the padded graph is cheaper
        it.inputs["attention_mask"][:] = 1
        it.inputs["input_ids"][it.inputs["input_ids"] == 0] = 1
    batches = [_batch(50, (16, 128), rng, 20_000), full, _batch(1500, (20, 120), rng, 30_000)]
    batches += [_batch(int(n), (16, 128), rng, 40_000 + 1000 * k) for k, n in enumerate(rng.integers(1, 2049, 12))]
    for b in batches:
        ex.submit(b)
    sink.wait(sum(len(b.items) for b in batches))
    assert ex.close(30)
    assert 0 < ex.stats.unpadded_launches < ex.stats.launches
    for b in batches:
        answers = [sink.got[item.handle] for item in b.items]
        assert all(err is None for _, err in answers), [err for _, err in answers if err is not None][:1]
        _check(repository, b, [out for out, _ in answers])  # type: ignore[misc]


def test_launches_past_graph_tokens_run_eagerly_at_their_own_count_and_match(repository: Path) -> None:
    from inflight.runtime.pipeline import SyncExecutor

    runner = _make(repository, graph_tokens=20_000)
    ex = SyncExecutor(runner)
    runner.warmup((64,))
    runner.warmup_unpadded(64)
    graphs = runner.engine.graphs()
    rng = np.random.default_rng(7)
    kept = 0
    for k in range(3):  # three token counts, none captured
        mixed = _batch(2048, (16, 128), rng, 1000 * k)
        kept += sum(int(it.inputs["attention_mask"].sum()) for it in mixed.items)
        _check(repository, mixed, in_band(ex, mixed))
    assert runner.engine.counters["exact"] == 3 and runner.engine.graphs() == graphs
    assert ex.stats.padded_tokens <= kept + 3 * 63  # only the rounding to 64 padded
    ex.close()
