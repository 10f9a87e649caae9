"""The stub's garbage-collector watch: pauses counted by generation, freeze, and a clean stop."""

from __future__ import annotations

import gc
import time

import pytest

from inflight.runtime import gcwatch
from inflight.runtime.gcwatch import GcWatch


def test_collections_are_counted_by_generation_until_stop() -> None:
    w = GcWatch()
    gc.collect()  # a full collection: generation 2
    gc.collect(0)
    got = w.stop()
    assert got["gc_gen2"] >= 1 and got["gc_collections"] >= 2
    assert got["gc_s"] >= got["gc_gen2_s"] >= 0.0 and got["gc_max_ms"] >= 0.0
    assert got["gc_frozen"] == 0
    gc.collect()
    assert w.stop()["gc_collections"] == got["gc_collections"]  # stopped: no more counted, stop() again is safe


def test_freeze_moves_what_is_alive_out_of_later_collections() -> None:
    keep = [[i] for i in range(10_000)]
    try:
        w = GcWatch(freeze=True)
        got = w.stop()
        assert got["gc_frozen"] >= len(keep)
    finally:
        gc.unfreeze()


def test_long_pauses_are_listed_with_their_time_from_the_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcwatch, "LONG_MS", 0.0)  # every pause is "long"
    origin = time.perf_counter() - 100.0
    w = GcWatch(origin=origin)
    gc.collect()
    got = w.stop()
    assert got["gc_collections"] >= 1 and got["gc_s"] >= 0.0 and got["gc_max_ms"] >= 0.0
    assert w.long and len(w.long) == got["gc_collections"]
    at, ms, gen = w.long[-1]
    assert 100.0 <= at < 200.0 and ms >= 0.0 and gen == 2
    gc.collect()  # after stop(): no longer counted
    assert len(w.long) == got["gc_collections"]
