"""Launches of the engine bench: a slot filled with valid inputs, launches timed with CUDA events.

:func:`time_launches` replays groups (:func:`launch_group`) back to back on a runner's compute
stream (no copies, no host work): the engine-only time the bench compares everything with; they
read the slot's device buffers, which :func:`fill_slot` fills first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inflight.runtime.batch import Batch, Buckets, Group, Item, gather
from inflight.runtime.runners import CudaRunner


def launch_group(rows: int, seq: int | None, spec: Any) -> Group:
    """A launch of ``rows`` rows at the bucket ``(rows, seq)``: the slot's first rows, offset 0 of every buffer."""
    return Group((rows, seq), rows, 0, {t.name: 0 for t in spec.inputs}, {t.name: 0 for t in spec.outputs})


def time_launches(runner: CudaRunner, groups: Sequence[Group], iters: int, warmup: int) -> float:
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


def fill_slot(runner: CudaRunner, spec: Any, seq: int | None) -> None:
    """Copy valid inputs into every element of the slot's device buffers (launch and wait once)."""
    slot = runner.slots[0]
    rows = runner.layout.max_items
    x = spec.example_inputs(rows, seq_len=seq, rng=np.random.default_rng(5))
    gather(runner.layout, Buckets(runner.buckets.batch, runner.buckets.seq), slot, Batch([Item(x, rows, seq, 0)]))
    runner.launch(slot)
    runner.wait(slot)
