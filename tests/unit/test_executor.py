"""The executors' logic on the CPU runner, with a tiny engine (the real engines run in integration/GPU tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from inflight.models.registry import ModelSpec, TensorSpec
from inflight.runtime.batch import Batch, Buckets, Item, Layout, gather, outputs_for, pow2_buckets
from inflight.runtime.engines.base import Engine
from inflight.runtime.executor import PipelinedExecutor, SyncExecutor
from inflight.runtime.runners import CpuRunner

SPEC = ModelSpec(
    name="toy",
    description="row sums",
    inputs=(TensorSpec(name="x", dtype="int64", dims=(-1,)),),
    outputs=(TensorSpec(name="y", dtype="float32", dims=(2,)),),
    max_batch_size=64,
    make_module=lambda seed: None,  # type: ignore[arg-type,return-value]
    max_seq_len=16,
    seq_input="x",
)


class ToyEngine(Engine):
    """y = [sum(x), len] per row; optionally slow, optionally failing on a marker value."""

    def __init__(self, delay_s: float = 0.0, gate: threading.Event | None = None) -> None:
        self.delay_s = delay_s
        self.gate = gate
        self.calls = 0

    @property
    def on_gpu(self) -> bool:
        return False

    def describe(self) -> str:
        return "toy"

    def run_host(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait(10)
        time.sleep(self.delay_s)
        x = inputs["x"]
        if (x == 666).any():
            raise RuntimeError("device fault")
        outputs["y"][:, 0] = x.sum(axis=1)
        outputs["y"][:, 1] = x.shape[1]

    def close(self) -> None:
        pass


class Sink:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.got: dict[int, tuple[Any, str | None]] = {}
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.threads: set[str] = set()

    def send(self, handle: Any, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        time.sleep(self.delay_s)
        with self.lock:
            assert handle not in self.got, "two responses for one request"
            self.got[handle] = (None if outputs is None else {k: v.copy() for k, v in outputs.items()}, error)
            self.threads.add(threading.current_thread().name)


def _runner(engine: Engine) -> CpuRunner:
    layout = Layout(SPEC, 64, 16)
    return CpuRunner(engine, layout, Buckets(tuple(range(1, 65)), tuple(range(1, 17))))


def _item(i: int, n: int, s: int, rng: np.random.Generator) -> Item:
    x = rng.integers(0, 100, size=(n, s))
    return Item(inputs={"x": x}, count=n, seq=s, handle=i)


def _expect(item: Item) -> np.ndarray:
    x = item.inputs["x"]
    return np.stack([x.sum(axis=1), np.full(len(x), x.shape[1])], axis=1).astype(np.float32)


def test_buckets() -> None:
    assert pow2_buckets(2048)[-1] == 2048 and pow2_buckets(2000)[-2:] == (1024, 2000)
    b = Buckets((1, 2, 4, 8), (16, 64))
    assert b.pick(3, 17) == (4, 64)
    assert b.pick(8, 16) == (8, 16)
    with pytest.raises(ValueError, match="exceed"):
        b.pick(9, 16)


def test_gather_pads_and_outputs_exclude_padding() -> None:
    layout = Layout(SPEC, 64, 16)
    runner = _runner(ToyEngine())
    (slot,) = runner.make_slots(1)
    rng = np.random.default_rng(0)
    items = [_item(0, 2, 5, rng), _item(1, 3, 7, rng)]
    gather(layout, slot, Batch(items), (8, 8))
    view = layout.view(slot.host_in["x"], SPEC.inputs[0], 8, 8)
    assert (view[:2, :5] == items[0].inputs["x"]).all() and (view[:2, 5:] == 0).all()
    assert (view[2:5, :7] == items[1].inputs["x"]).all() and (view[2:5, 7:] == 0).all()
    outs = outputs_for(layout, slot)
    assert [o["y"].shape for o in outs] == [(2, 2), (3, 2)]
    runner.close()


def test_sync_executor_is_exact() -> None:
    ex = SyncExecutor(_runner(ToyEngine()))
    rng = np.random.default_rng(1)
    items = [_item(i, int(rng.integers(1, 5)), 6, rng) for i in range(5)]
    outs = ex.run(Batch(items))
    for item, out in zip(items, outs, strict=True):
        np.testing.assert_array_equal(out["y"], _expect(item))
    assert ex.stats.max_depth == 1 and ex.stats.batches == 1
    assert ex.close()


def test_pipelined_many_batches_every_request_gets_its_own_result() -> None:
    sink = Sink(delay_s=0.001)
    ex = PipelinedExecutor(_runner(ToyEngine(delay_s=0.002)), sink, slots=3, response_threads=4)
    rng = np.random.default_rng(2)
    expected = {}
    k = 0
    for _ in range(60):
        s = int(rng.integers(1, 17))
        items = []
        for _ in range(int(rng.integers(1, 6))):
            it = _item(k, int(rng.integers(1, 8)), s, rng)
            expected[k] = _expect(it)
            items.append(it)
            k += 1
        ex.submit(Batch(items))
    assert ex.close(timeout_s=30)
    assert set(sink.got) == set(expected)
    for h, (out, err) in sink.got.items():
        assert err is None
        np.testing.assert_array_equal(out["y"], expected[h])  # type: ignore[index]
    st = ex.stats
    assert st.max_depth > 1, "batches never overlapped"
    assert st.responses == len(expected)
    assert len(sink.threads) > 1, "responses were not sent concurrently"


def test_back_pressure_waits_for_a_slot_and_counts_it() -> None:
    gate = threading.Event()
    sink = Sink()
    ex = PipelinedExecutor(_runner(ToyEngine(gate=gate)), sink, slots=2, response_threads=2)
    rng = np.random.default_rng(3)
    ex.submit(Batch([_item(0, 1, 4, rng)]))
    ex.submit(Batch([_item(1, 1, 4, rng)]))
    t = threading.Thread(target=ex.submit, args=(Batch([_item(2, 1, 4, rng)]),))
    t.start()
    time.sleep(0.2)
    assert t.is_alive(), "third submit should wait: both slots are busy"
    assert ex.stats.slot_waits == 1
    gate.set()
    t.join(10)
    assert not t.is_alive()
    assert ex.close(10)
    assert sorted(sink.got) == [0, 1, 2]
    assert ex.stats.slot_wait_s > 0.1


def test_a_failing_batch_fails_only_its_requests() -> None:
    sink = Sink()
    ex = PipelinedExecutor(_runner(ToyEngine()), sink, slots=2, response_threads=2)
    rng = np.random.default_rng(4)
    good1 = _item(0, 2, 3, rng)
    bad = _item(1, 1, 3, rng)
    bad.inputs["x"][0, 0] = 666
    bad_batch_peer = _item(2, 1, 3, rng)
    good2 = _item(3, 2, 3, rng)
    ex.submit(Batch([good1]))
    ex.submit(Batch([bad, bad_batch_peer]))
    ex.submit(Batch([good2]))
    assert ex.close(10)
    assert sink.got[0][1] is None and sink.got[3][1] is None
    assert "device fault" in str(sink.got[1][1]) and "device fault" in str(sink.got[2][1])
    assert ex.stats.failed_batches == 1


def test_close_with_work_stuck_fails_it_explicitly_and_does_not_hang() -> None:
    gate = threading.Event()
    sink = Sink()
    ex = PipelinedExecutor(_runner(ToyEngine(gate=gate)), sink, slots=2, response_threads=2)
    rng = np.random.default_rng(5)
    ex.submit(Batch([_item(0, 1, 4, rng), _item(1, 1, 4, rng)]))
    t0 = time.monotonic()
    drained = ex.close(timeout_s=0.5)
    assert not drained and time.monotonic() - t0 < 10
    assert "unloaded" in str(sink.got[0][1]) and "unloaded" in str(sink.got[1][1])
    gate.set()
    with pytest.raises(Exception, match="being unloaded"):
        ex.submit(Batch([_item(2, 1, 4, rng)]))
