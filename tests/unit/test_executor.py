"""The executors' logic on the CPU runner, with a tiny engine (the real engines run in integration/GPU tests)."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from tests.helpers import TOY_SPEC, Collect, in_band

from inflight.models.spec import ModelSpec, TensorSpec
from inflight.runtime.batch import (
    Batch,
    Buckets,
    Item,
    Layout,
    Slot,
    gather,
    outputs_for,
    partition_values,
    plan,
    pow2_buckets,
)
from inflight.runtime.engines.base import HostEngine
from inflight.runtime.pipeline import PipelinedExecutor, SyncExecutor
from inflight.runtime.pipeline.contract import SHUTTING_DOWN
from inflight.runtime.runners import CpuRunner

SPEC = TOY_SPEC


class ToyEngine(HostEngine):
    """y = [sum(x), len] per row; optionally slow, optionally failing on a marker value."""

    def __init__(self, delay_s: float = 0.0, gate: threading.Event | None = None, per_row_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.per_row_s = per_row_s
        self.gate = gate
        self.calls = 0

    def describe(self) -> str:
        return "toy"

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait(10)
        x = inputs["x"]
        time.sleep(self.delay_s + self.per_row_s * len(x))
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


def _runner(engine: HostEngine) -> CpuRunner:
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
    gather(layout, Buckets((1, 2, 4, 8), (8, 16), 8192), slot, Batch(items))
    assert [(g.bucket, g.rows) for g in slot.groups] == [((8, 8), 5)]
    view = layout.view(slot.host_in["x"], SPEC.inputs[0], 5, 8)
    assert (view[:2, :5] == items[0].inputs["x"]).all() and (view[:2, 5:] == 0).all()
    assert (view[2:5, :7] == items[1].inputs["x"]).all() and (view[2:5, 7:] == 0).all()
    assert slot.real_tokens == 2 * 5 + 3 * 7 and slot.padded_tokens == 8 * 8
    outs = outputs_for(layout, slot)
    assert [o["y"].shape for o in outs] == [(2, 2), (3, 2)]
    runner.close()


def test_split_weighs_padding_against_another_launch() -> None:
    b = Buckets(pow2_buckets(2048), (64,), 8192)
    assert b.split(1160, 64)[0] == [(1024, 1024), (136, 256)]
    assert b.split(2000, 64)[0] == [(2000, 2048)]
    assert b.split(5000, 64)[0][:2] == [(2048, 2048), (2048, 2048)]
    # free launches: every group is cut to exact buckets, nothing padded
    assert Buckets(tuple(range(1, 65)), None).split(37)[0] == [(37, 37)]


def test_plan_groups_by_length_and_merges_small_groups() -> None:
    spec = dataclasses.replace(SPEC, name="toy2", max_batch_size=4096, max_seq_len=128)
    layout = Layout(spec, 4096, 128)
    rng = np.random.default_rng(3)
    big = [_item(i, 500, s, rng) for i, s in enumerate((20, 60, 100, 128))]
    # four lengths, each 500 rows: four sequence buckets, each its own launch
    groups, rows, used = plan(layout, Buckets(pow2_buckets(2048), (32, 64, 128), 8192), Batch(big))
    assert [g.bucket[1] for g in groups] == [32, 64, 128] and sum(g.rows for g in groups) == 2000
    assert rows == (0, 500, 1000, 1500)
    assert used["x"] == 500 * 32 + 500 * 64 + 1000 * 128
    # a few short rows beside many long ones: cheaper padded into the long launch than launched alone
    small = [_item(0, 3, 10, rng), _item(1, 900, 120, rng)]
    groups, rows, _ = plan(layout, Buckets(pow2_buckets(2048), (16, 128), 8192), Batch(small))
    assert [(g.bucket, g.rows) for g in groups] == [((1024, 128), 903)]
    # with free launches and exact buckets (the CPU), nothing is padded or merged
    groups, _, _ = plan(layout, Buckets(tuple(range(1, 2049)), (16, 128)), Batch(small))
    assert [g.bucket[1] for g in groups] == [16, 128]


def test_mixed_lengths_in_one_batch_each_request_gets_its_own_rows() -> None:
    """A batch of several sequence buckets: groups run at their own length, results map back."""
    layout = Layout(SPEC, 64, 16)
    runner = CpuRunner(ToyEngine(), layout, Buckets(tuple(range(1, 65)), (4, 8, 16)))
    ex = SyncExecutor(runner)
    rng = np.random.default_rng(4)
    items = [_item(i, int(rng.integers(1, 6)), int(s), rng) for i, s in enumerate((3, 15, 7, 4, 16, 1, 8))]
    outs = in_band(ex, Batch(items))
    for item, out in zip(items, outs, strict=True):
        want = _expect(item)
        np.testing.assert_array_equal(out["y"][:, 0], want[:, 0])  # sums: zero padding adds nothing
        bucket = 4 if item.seq <= 4 else 8 if item.seq <= 8 else 16  # type: ignore[operator]
        assert (out["y"][:, 1] == bucket).all()
    assert ex.stats.launches == 3 and ex.stats.mixed_length_batches == 1
    assert ex.stats.real_tokens == sum(i.count * i.seq for i in items)  # type: ignore[misc]
    assert ex.stats.padded_tokens > ex.stats.real_tokens
    assert ex.close()


def test_sync_executor_is_exact() -> None:
    ex = SyncExecutor(_runner(ToyEngine()))
    rng = np.random.default_rng(1)
    items = [_item(i, int(rng.integers(1, 5)), 6, rng) for i in range(5)]
    outs = in_band(ex, Batch(items))
    for item, out in zip(items, outs, strict=True):
        np.testing.assert_array_equal(out["y"], _expect(item))
    assert ex.stats.max_depth == 1 and ex.stats.batches == 1
    # each step's longest of one batch (one batch: its own times), where an execute() over 10 ms went
    st = ex.stats
    assert st.gather_max_s == st.gather_s > 0 and st.launch_max_s == st.launch_s > 0
    assert st.wait_max_s == st.device_wait_s >= 0
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


class GatedSink(Sink):
    """Holds every send until ``gate`` opens (a stalled response path)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def send(self, handle: Any, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        assert self.gate.wait(10), "gate never opened"
        super().send(handle, outputs, error)


def test_a_slot_is_free_once_its_outputs_are_copied_not_when_responses_are_sent() -> None:
    sink = GatedSink()
    ex = PipelinedExecutor(_runner(ToyEngine()), sink, slots=1, response_threads=2, response_backlog=8)
    rng = np.random.default_rng(6)
    items = [_item(i, 2, 4, rng) for i in range(4)]
    t0 = time.monotonic()
    for it in items:
        ex.submit(Batch([it]))  # one slot: each submit needs the previous batch off the device only
    assert time.monotonic() - t0 < 5 and not sink.got, "submit waited for the response path"
    sink.gate.set()
    assert ex.close(10)
    for it in items:
        np.testing.assert_array_equal(sink.got[it.handle][0]["y"], _expect(it))  # type: ignore[index]
    assert ex.stats.send_waits == 0


def test_response_backlog_bounds_waiting_batches_and_back_pressure_reaches_submit() -> None:
    sink = GatedSink()
    ex = PipelinedExecutor(_runner(ToyEngine()), sink, slots=1, response_threads=1, response_backlog=1)
    rng = np.random.default_rng(7)
    items = [_item(i, 1, 4, rng) for i in range(4)]
    done = threading.Event()

    def feed() -> None:
        for it in items:
            ex.submit(Batch([it]))
        done.set()

    t = threading.Thread(target=feed)
    t.start()
    time.sleep(0.5)
    # batch 0 waits in the sender, batch 1 waits for backlog room holding the only slot, batch 2 waits for it
    assert not done.is_set(), "submit should be held back while the response path is stalled"
    assert ex.stats.send_waits >= 1 and ex.stats.slot_waits >= 1
    sink.gate.set()
    t.join(10)
    assert done.is_set()
    assert ex.close(10)
    assert sorted(sink.got) == [0, 1, 2, 3]
    assert ex.stats.send_wait_s > 0.2 and ex.stats.respond_latency_s > 0


TOKENS = ModelSpec(
    name="toy_tokens",
    description="row sums of token ids",
    inputs=(
        TensorSpec(name="input_ids", dtype="int64", dims=(-1,)),
        TensorSpec(name="attention_mask", dtype="int64", dims=(-1,)),
    ),
    outputs=(TensorSpec(name="y", dtype="float32", dims=(2,)),),
    max_batch_size=64,
    make_module=lambda seed: None,  # type: ignore[arg-type,return-value]
    max_seq_len=16,
    vocab_size=100,
    seq_input="input_ids",
    mask_input="attention_mask",  # its values are checked because it is declared (as config.pbtxt's mask_input)
)


class TokenEngine(ToyEngine):
    def run(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        super().run({"x": inputs["input_ids"]}, outputs)


def _token_item(i: int, bad: int | None = None) -> Item:
    ids = np.full((2, 4), 7, dtype=np.int64)
    if bad is not None:
        ids[1, 2] = bad
    return Item(inputs={"input_ids": ids, "attention_mask": np.ones_like(ids)}, count=2, seq=4, handle=i)


@pytest.mark.parametrize("bad", [100, -1, 10**12])
def test_out_of_vocabulary_ids_are_partitioned_out_before_anything_is_submitted(bad: int) -> None:
    items = [_token_item(0), _token_item(1, bad), _token_item(2)]
    good, refused = partition_values(TOKENS, items)
    assert [it.handle for it in good] == [0, 2]
    ((item, error),) = refused
    assert item.handle == 1 and error.reason == "token_out_of_range"
    assert f"token id {bad} is outside the vocabulary" in str(error)
    mask = _token_item(3)
    mask.inputs["attention_mask"][0, 0] = 2
    good, refused = partition_values(TOKENS, [_token_item(0), mask])
    assert [it.handle for it in good] == [0] and [(it.handle, e.reason) for it, e in refused] == [(3, "mask_value")]
    everything = [_token_item(i) for i in range(4)]
    assert partition_values(TOKENS, everything) == (everything, [])

    engine = TokenEngine()
    runner = CpuRunner(engine, Layout(TOKENS, 64, 16), Buckets(tuple(range(1, 65)), tuple(range(1, 17))))
    with SyncExecutor(runner) as sync:
        assert in_band(sync, Batch(partition_values(TOKENS, items)[0]))[0]["y"][0, 0] == 28
    assert engine.calls == 1


def test_an_executor_refuses_use_after_close() -> None:
    from inflight.errors import ClosedError

    rng = np.random.default_rng(6)
    with SyncExecutor(_runner(ToyEngine())) as sync:
        in_band(sync, Batch([_item(0, 1, 4, rng)]))
    with pytest.raises(ClosedError, match="used after close"):
        in_band(sync, Batch([_item(1, 1, 4, rng)]))
    sink = Sink()
    with PipelinedExecutor(_runner(ToyEngine()), sink, slots=1, response_threads=1) as ex:
        ex.submit(Batch([_item(0, 1, 4, rng)]))
    assert sorted(sink.got) == [0]
    with pytest.raises(ClosedError):
        ex.submit(Batch([_item(1, 1, 4, rng)]))
    assert ex.close()  # closing twice is harmless
    with _runner(ToyEngine()) as runner:
        runner.make_slots(1)
    with pytest.raises(ClosedError, match="CpuRunner used after close"):
        runner.make_slots(1)


def test_senders_hold_off_while_the_issue_path_runs_and_never_deadlock() -> None:
    sink = Sink()
    ex = PipelinedExecutor(_runner(ToyEngine()), sink, slots=1, response_threads=2, response_backlog=1)
    rng = np.random.default_rng(8)
    with ex.issuing():
        ex.submit(Batch([_item(0, 1, 4, rng)]))
        time.sleep(0.3)
        assert not sink.got, "a response was built while execute() was running"
        # the only slot waits for the backlog, which waits for the senders: submit must let them run
        # (batch 2 holds the slot while the completion thread waits for backlog room for batch 1)
        for i in (1, 2, 3):
            ex.submit(Batch([_item(i, 1, 4, rng)]))
        assert ex.stats.slot_waits >= 1
    assert ex.close(10)
    assert sorted(sink.got) == [0, 1, 2, 3]

    sink = Sink()
    ex = PipelinedExecutor(_runner(ToyEngine()), sink, slots=1, response_threads=2, yield_to_issue=False)
    with ex.issuing():
        ex.submit(Batch([_item(0, 1, 4, rng)]))
        deadline = time.monotonic() + 5
        while not sink.got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sink.got, "yield_to_issue=False: responses go out during execute()"
    assert ex.close(10)


def test_a_launch_failure_with_a_full_backlog_inside_execute_does_not_deadlock() -> None:
    sink = Sink()
    runner = _runner(ToyEngine())
    ex = PipelinedExecutor(runner, sink, slots=2, response_threads=1, response_backlog=1)
    rng = np.random.default_rng(9)
    done = threading.Event()

    def execute() -> None:
        with ex.issuing():
            ex.submit(Batch([_item(0, 1, 4, rng)]))
            time.sleep(0.3)  # batch 0 is done and holds the only backlog permit; its sender waits for us

            def broken(slot: Any) -> None:
                raise RuntimeError("launch failed")

            runner.launch = broken  # type: ignore[method-assign]
            ex.submit(Batch([_item(1, 1, 4, rng)]))  # its error responses need backlog room
        done.set()

    t = threading.Thread(target=execute, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "execute() and the senders waited for each other"
    assert ex.close(10)
    assert sink.got[0][1] is None and "launch failed" in str(sink.got[1][1])


# -- overlap and auto modes -----------------------------------------------------------------------
def _respond(outputs: Mapping[str, np.ndarray] | None, error: str | None) -> Any:
    """The test's response object: a private copy of the outputs, or the error."""
    return ("ok", {k: v.copy() for k, v in outputs.items()}) if outputs is not None else ("error", error)


def _run_overlap(ex: Any, items: list[Item]) -> list[Any]:
    """Run a batch (handles: positions) on the overlap executor; each request's response object, in order."""
    from inflight.runtime.pipeline import Returned

    returned = Returned(_respond, n=len(items))
    ex.run(Batch(items), returned)
    return returned.responses


@pytest.mark.parametrize(
    ("counts", "chunk_items", "max_chunks", "expected"),
    [
        ([50] * 40, 512, 8, [(0, 10), (10, 20), (20, 30), (30, 40)]),
        ([50] * 40, 1024, 8, [(0, 20), (20, 40)]),
        ([50] * 40, 100, 3, [(0, 13), (13, 27), (27, 40)]),
        ([50] * 10, 512, 8, [(0, 10)]),  # below twice the chunk: one chunk
        ([2000, 1, 1], 512, 8, [(0, 1), (1, 2), (2, 3)]),  # one request per chunk at most
        ([], 512, 8, []),
    ],
)
def test_chunk_bounds_cut_at_request_boundaries_into_even_chunks(
    counts: list[int], chunk_items: int, max_chunks: int, expected: list[tuple[int, int]]
) -> None:
    from inflight.runtime.pipeline import chunk_bounds

    assert chunk_bounds(counts, chunk_items, max_chunks) == expected


def test_chunk_bounds_cover_every_request_once() -> None:
    from inflight.runtime.pipeline import chunk_bounds

    rng = np.random.default_rng(0)
    for _ in range(300):
        counts = [int(c) for c in rng.integers(1, 200, size=int(rng.integers(1, 60)))]
        bounds = chunk_bounds(counts, int(rng.integers(1, 600)), int(rng.integers(1, 9)))
        assert bounds[0][0] == 0 and bounds[-1][1] == len(counts)
        assert all(lo < hi for lo, hi in bounds)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))


def _overlap(engine: HostEngine, chunk_items: int = 8, slots: int = 3) -> Any:
    from inflight.runtime.pipeline import OverlapExecutor

    return OverlapExecutor(_runner(engine), slots=slots, chunk_items=chunk_items, max_chunks=8)


def test_overlap_returns_every_response_inline_and_exact() -> None:
    engine = ToyEngine(delay_s=0.002)
    ex = _overlap(engine)
    rng = np.random.default_rng(10)
    for _ in range(30):
        s = int(rng.integers(1, 17))
        items = [_item(k, int(rng.integers(1, 9)), s, rng) for k in range(int(rng.integers(1, 12)))]
        out = _run_overlap(ex, items)
        assert len(out) == len(items)
        for it, (kind, value) in zip(items, out, strict=True):
            assert kind == "ok"
            np.testing.assert_array_equal(value["y"], _expect(it))
    st = ex.stats
    assert st.chunks > st.overlap_batches == 30, "no batch was cut into chunks"
    assert st.max_depth >= 2, "chunks never overlapped on the device"
    assert ex.close(10)


def test_a_failing_chunk_fails_only_its_requests() -> None:
    from inflight.runtime.pipeline import OverlapExecutor

    layout = Layout(TOKENS, 64, 16)

    class FaultyEngine(TokenEngine):
        def run(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
            if (inputs["input_ids"] == 99).any():
                raise RuntimeError("device fault")
            super().run(inputs, outputs)

    runner = CpuRunner(FaultyEngine(), layout, Buckets(tuple(range(1, 65)), tuple(range(1, 17))))
    ex = OverlapExecutor(runner, slots=2, chunk_items=4, max_chunks=8)
    items = [_token_item(i) for i in range(6)]
    items[4].inputs["input_ids"][0, 0] = 99  # a device fault, in the third chunk with item 5
    out = _run_overlap(ex, items)
    assert [o[0] for o in out] == ["ok", "ok", "ok", "ok", "error", "error"]
    assert "device fault" in out[4][1] and "device fault" in out[5][1]
    np.testing.assert_array_equal(out[2][1]["y"], [[28, 4], [28, 4]])
    # the executor carries on: the slots went back to the ring
    assert [o[0] for o in _run_overlap(ex, [_token_item(i) for i in range(4)])] == ["ok"] * 4
    assert ex.stats.failed_batches == 1
    assert ex.close(10)


def test_overlap_needs_two_slots() -> None:
    with pytest.raises(ValueError, match="at least 2 slots"):
        _overlap(ToyEngine(), Sink(), slots=1)


def test_pipelined_run_is_the_sync_path_on_a_slot_of_the_ring() -> None:
    """``PipelinedExecutor.run`` (auto's in-band path) answers as ``SyncExecutor.run`` and leaves the ring free."""
    rng = np.random.default_rng(21)
    batches = [[_item(b * 4 + j, int(rng.integers(1, 6)), 7, rng) for j in range(4)] for b in range(5)]
    sink = Sink()
    with (
        SyncExecutor(_runner(ToyEngine())) as sync,
        PipelinedExecutor(_runner(ToyEngine(delay_s=0.002)), sink, slots=2, response_threads=1) as ring,
    ):
        for items in batches:
            want = [o["y"].copy() for o in in_band(sync, Batch(items))]
            got = in_band(ring, Batch(items))
            assert [o["y"].tolist() for o in got] == [w.tolist() for w in want]
            assert ring.in_flight() == 0
        # a batch deferred before an in-band one: both answered, each through its own path
        deferred = [_item(100 + j, 2, 7, rng) for j in range(3)]
        ring.submit(Batch(deferred))
        inline = [_item(200, 3, 7, rng)]
        np.testing.assert_array_equal(in_band(ring, Batch(inline))[0]["y"], _expect(inline[0]))
    assert sorted(sink.got) == [100, 101, 102]
    st = ring.stats
    assert st.batches == 7 and st.inline_wait_s > 0 and st.inline_wait_s <= st.device_wait_s
    assert sync.stats.inline_wait_s == sync.stats.device_wait_s


def test_in_band_batches_all_run_on_the_slot_released_last() -> None:
    """auto's in-band path touches one slot's buffers, as sync's one slot, not each slot of the ring in turn."""
    rng = np.random.default_rng(8)
    with PipelinedExecutor(_runner(ToyEngine()), Sink(), slots=4, response_threads=1) as ring:
        for b in range(6):
            item = _item(b, 2, 5, rng)
            np.testing.assert_array_equal(in_band(ring, Batch([item]))[0]["y"], _expect(item))
        assert sorted(s.generation for s in ring.slots) == [0, 0, 0, 6]
        # a deferred batch takes that slot too (the one released last); the next in-band one gets another while
        # it is busy
        ring.submit(Batch([_item(10, 2, 5, rng)]))
        item = _item(11, 2, 5, rng)
        np.testing.assert_array_equal(in_band(ring, Batch([item]))[0]["y"], _expect(item))
    assert sum(s.generation for s in ring.slots) == 8


def test_the_ring_starts_its_threads_with_the_first_deferred_batch_only() -> None:
    """An auto instance that answers in-band holds no more threads than a sync one; closing one that never
    deferred, or one that did, leaves no thread behind."""
    rng = np.random.default_rng(5)

    def ours() -> set[str]:
        return {t.name for t in threading.enumerate() if t.name.startswith(("inflight-send", "inflight-completion"))}

    assert not ours()
    sink = Sink()
    ring = PipelinedExecutor(_runner(ToyEngine()), sink, slots=2, response_threads=3)
    try:
        for b in range(3):
            item = _item(b, 2, 5, rng)
            np.testing.assert_array_equal(in_band(ring, Batch([item]))[0]["y"], _expect(item))
        assert not ours(), "in-band batches started threads"
        ring.submit(Batch([_item(10, 2, 5, rng)]))
        assert ours() == {"inflight-send-0", "inflight-send-1", "inflight-send-2", "inflight-completion"}
    finally:
        assert ring.close()
    assert not ours() and sorted(sink.got) == [10]
    with PipelinedExecutor(_runner(ToyEngine()), Sink(), slots=2, response_threads=2) as idle:
        in_band(idle, Batch([_item(20, 1, 5, rng)]))
    assert not ours()


def test_in_band_before_any_deferral_skips_the_ring_and_after_one_goes_through_it() -> None:
    """Until the first ``submit`` only the execute thread uses the ring, so ``run`` takes the slot without
    ``acquire``/``release`` (sync's cost); from the first deferral on, the ring hands out the slots again. A
    closing ring refuses either way."""
    rng = np.random.default_rng(13)
    with PipelinedExecutor(_runner(ToyEngine(delay_s=0.002)), Sink(), slots=2, response_threads=1) as ring:
        taken: list[int] = []
        acquire = ring.ring.acquire

        def counting() -> Slot:
            slot = acquire()
            taken.append(slot.index)
            return slot

        ring.ring.acquire = counting  # type: ignore[method-assign]
        for b in range(3):
            item = _item(b, 2, 5, rng)
            np.testing.assert_array_equal(in_band(ring, Batch([item]))[0]["y"], _expect(item))
        assert taken == [] and ring.stats.depth_launches[1] == 3 and ring.stats.max_depth == 1
        ring.submit(Batch([_item(10, 2, 5, rng)]))
        item = _item(11, 2, 5, rng)
        np.testing.assert_array_equal(in_band(ring, Batch([item]))[0]["y"], _expect(item))
        assert len(taken) == 2  # the deferred batch's slot and the in-band one's, each from the ring
    with PipelinedExecutor(_runner(ToyEngine()), Sink(), slots=2, response_threads=1) as closing:
        closing.ring.drain(time.monotonic())
        refused = Collect()
        closing.run(Batch([_item(20, 2, 5, rng)]), refused)
        assert refused.got == {20: (None, SHUTTING_DOWN)}


@pytest.mark.parametrize("executor", ["sync", "pipelined"])
def test_an_in_band_batch_that_fails_on_the_device_fails_alone(executor: str) -> None:
    """Each request of the failed batch gets the device's error through the sink; the next batch is answered."""
    rng = np.random.default_rng(30)
    bad = _item(0, 2, 4, rng)
    bad.inputs["x"][0, 0] = 666  # ToyEngine raises on it
    runner = _runner(ToyEngine())
    with (
        SyncExecutor(runner)
        if executor == "sync"
        else PipelinedExecutor(runner, Sink(), slots=2, response_threads=1) as ex
    ):
        sink = Collect()
        ex.run(Batch([bad, _item(1, 1, 4, rng)]), sink)
        error = "batch failed on the device: batch failed on the CPU: RuntimeError: device fault"
        assert sink.got == {0: (None, error), 1: (None, error)}
        assert ex.stats.failed_batches == 1
        good = _item(2, 3, 4, rng)
        np.testing.assert_array_equal(in_band(ex, Batch([good]))[0]["y"], _expect(good))
