"""The stub's garbage-collector watch: pauses counted by generation, freeze, and a clean stop."""

from __future__ import annotations

import gc

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
