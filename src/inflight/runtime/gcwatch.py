"""The stub process's garbage-collector pauses, counted for the ``finalized`` log line.

A Python-backend stub runs every request of its instance through one interpreter: a collection of
the oldest generation walks every object the process holds (torch alone brings some hundred
thousand) with the GIL held, and every thread of the stub, the execute thread included, waits for
it. ``GcWatch`` measures those pauses through ``gc.callbacks`` (two clock reads per collection)
and, with ``freeze``, moves everything alive after the model's load into the permanent generation
(``gc.freeze()``) so later collections no longer walk it.
"""

from __future__ import annotations

import gc
import time
from typing import Any, ClassVar

from inflight.runtime.pipeline.stats import Aggregation

#: A pause at least this long (ms) is listed in ``GcWatch.long`` with its time.
LONG_MS = 5.0
#: Most long pauses listed.
LONG_MAX = 100


class GcWatch:
    """Counts collections and their pauses from construction to ``stop()``.

    Args:
        freeze: Collect once, then ``gc.freeze()`` what is alive (the model, torch, the engine).
        origin: ``time.perf_counter()`` the long pauses' times count from (default: construction).

    Attributes:
        long: Pauses of at least ``LONG_MS``: ``[s from origin, ms, generation]`` (the first ``LONG_MAX``).
    """

    #: Each figure ``stop()`` returns, and how it combines over instances (``inflight.runtime.record``).
    FIGURES: ClassVar[dict[str, Aggregation]] = {
        "gc_collections": "sum",
        "gc_gen2": "sum",
        "gc_s": "sum",
        "gc_gen2_s": "sum",
        "gc_max_ms": "max",
        "gc_frozen": "sum",
    }

    def __init__(self, *, freeze: bool = False, origin: float | None = None) -> None:
        self.origin = time.perf_counter() if origin is None else origin
        self.long: list[list[float]] = []
        self.frozen = 0
        if freeze:
            gc.collect()
            gc.freeze()
            self.frozen = gc.get_freeze_count()
        self.collections = [0, 0, 0]
        self.pause_s = [0.0, 0.0, 0.0]
        self.max_pause_s = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        dt = time.perf_counter() - self._t0
        gen = min(int(info.get("generation", 0)), 2)
        self.collections[gen] += 1
        self.pause_s[gen] += dt
        self.max_pause_s = max(self.max_pause_s, dt)
        if dt * 1e3 >= LONG_MS and len(self.long) < LONG_MAX:
            self.long.append([round(self._t0 - self.origin, 3), round(dt * 1e3, 2), gen])

    def stop(self) -> dict[str, float | int]:
        """Stop counting.

        Returns:
            ``gc_collections``, ``gc_gen2``, ``gc_s``, ``gc_gen2_s``, ``gc_max_ms`` and ``gc_frozen``.
        """
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        return {
            "gc_collections": sum(self.collections),
            "gc_gen2": self.collections[2],
            "gc_s": round(sum(self.pause_s), 6),
            "gc_gen2_s": round(self.pause_s[2], 6),
            "gc_max_ms": round(self.max_pause_s * 1e3, 3),
            "gc_frozen": self.frozen,
        }
